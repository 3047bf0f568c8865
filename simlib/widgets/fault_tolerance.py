"""The explorer of lesson 08: how often to checkpoint (Young and Daly)."""

from __future__ import annotations


def checkpoint_interval_explorer(save_seconds: float = 30.0, mtbf_hours: float = 24.0, restart_seconds: float = 60.0):
    """Sliders for the save time, the job's mean time between failures and the restart time; prints Young's and
    Daly's checkpoint interval and the share of time lost (``simlib.checkpoint``)."""
    import math

    from ipywidgets import FloatLogSlider, interact

    from ..checkpoint import checkpoint_interval, wasted_fraction

    def show(save_seconds, mtbf_hours, restart_seconds):
        m = mtbf_hours * 3600
        young, daly = math.sqrt(2 * save_seconds * m), checkpoint_interval(save_seconds, m)
        print(
            f"Young: every {young / 3600:.2f} h ({young / 60:.1f} min); Daly: every {daly / 3600:.2f} h "
            f"({daly / 60:.1f} min) of compute"
        )
        print(
            f"time lost at Daly's interval: {wasted_fraction(daly, save_seconds, m, restart_seconds):.1%}; "
            f"checkpointing 4x as often: {wasted_fraction(daly / 4, save_seconds, m, restart_seconds):.1%}, "
            f"4x as rarely: {wasted_fraction(daly * 4, save_seconds, m, restart_seconds):.1%}"
        )

    # fine steps (0.1 % apart): the sliders start at the values given, not at the nearest of a coarse grid
    return interact(
        show,
        save_seconds=FloatLogSlider(
            value=save_seconds, base=10, min=-1, max=4, step=0.0005, description="save (s)", readout_format=".4g"
        ),
        mtbf_hours=FloatLogSlider(
            value=mtbf_hours, base=10, min=-1, max=3, step=0.0005, description="MTBF (h)", readout_format=".4g"
        ),
        restart_seconds=FloatLogSlider(
            value=restart_seconds, base=10, min=0, max=3.5, step=0.0005, description="restart (s)", readout_format=".4g"
        ),
    )
