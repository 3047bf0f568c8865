"""Helpers every lesson's explorer shares: a figure, controls wired to a pure drawing function, presets."""

from __future__ import annotations

import numpy as np


def _figure(ncols=2, figsize=(11, 3.6)):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    return fig, axes


def _wire(controls: dict, draw, columns: int = 3, width: str = "330px"):
    """Controls in a grid above an output that ``draw(**values)`` fills; ``draw`` returns (figure, caption)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    text = W.HTML()

    def redraw(**values):
        try:
            fig, caption = draw(**values)
        except ValueError as exc:  # an impossible combination: say why, draw nothing
            text.value = f"<b>not a valid choice:</b> {exc}"
            return
        text.value = caption
        display(fig)
        plt.close(fig)

    out = W.interactive_output(redraw, controls)
    grid = W.GridBox(list(controls.values()), layout=W.Layout(grid_template_columns=f"repeat({columns}, {width})"))
    return W.VBox([grid, text, out])


def _log_slider(description, value, lo, hi, readout="{:.3g}"):
    import ipywidgets as W

    options = sorted({float(v) for v in np.geomspace(lo, hi, 25)} | {float(value)})
    return W.SelectionSlider(
        options=[(readout.format(v), v) for v in options],
        value=float(value),
        description=description,
        continuous_update=False,
    )


def _mb(nbytes):
    return nbytes / 2**20


def _preset_dropdown():
    """Every hardware preset of ``simlib.sim.hardware.PRESETS`` (a new preset shows up here by itself)."""
    import ipywidgets as W

    from ..sim.hardware import PRESETS

    return W.Dropdown(options=[(make().name, key) for key, make in PRESETS.items()], description="hardware")


def _hardware(name_or_hw):
    from .. import sim

    return sim.preset(name_or_hw) if isinstance(name_or_hw, str) else name_or_hw
