"""The explorer of lesson 04: a schedule -> Gantt chart and bubble."""

from __future__ import annotations

from ._common import _wire


def pipeline_figure(
    schedule: str = "1f1b",
    num_stages: int = 4,
    num_microbatches: int = 8,
    num_chunks: int = 2,
    backward_ratio: float = 2.0,
    p2p_ratio: float = 0.0,
    measured=None,
):
    """Build ``schedule`` with ``parallel.schedules``, check it, replay it (``sim.replay_pipeline``: a forward of
    the whole stage takes 1, a backward ``backward_ratio``, a message ``p2p_ratio``) -> Gantt chart; beside it the
    bubble (``lessons.pipeline.bubble`` on the replay) against m, the formula, and ``measured`` (rows
    ``microbatches``, ``bubble``, ``bubble_iqr``, measured at ``measured_stages`` = 2) when p = 2.
    Returns (figure, caption)."""
    import matplotlib.pyplot as plt

    from .. import plots
    from ..lessons.pipeline import bubble, make_schedule
    from ..parallel import schedules
    from ..sim import replay_pipeline

    v = num_chunks if schedule == "interleaved_1f1b" else 1

    def replay(m):
        s = make_schedule(schedule, num_stages, m, v)
        schedules.check(s)
        unit = 1e-3  # plots.gantt draws milliseconds: one forward of a whole stage reads as 1
        return s, replay_pipeline(s, unit / v, unit * backward_ratio / v, unit * p2p_ratio, steps=1)

    sched, table = replay(num_microbatches)
    b = bubble(table)["bubble"]
    formula = schedules.bubble_fraction(num_stages, num_microbatches, v)
    fig = plt.figure(figsize=(13, 0.9 + 0.5 * num_stages + 1.5))
    ax_g = fig.add_axes([0.05, 0.18, 0.55, 0.7])
    ax_b = fig.add_axes([0.76, 0.18, 0.22, 0.7])
    labelled = table.assign(name=table.name.where(table.kind.isin(["forward", "backward"]), ""))
    plots.gantt(
        labelled,
        ax=ax_g,
        step=0,
        label_spans=num_stages * num_microbatches * v <= 32,
        title=f"{schedule}, p = {num_stages}, m = {num_microbatches}" + (f", v = {v}" if v > 1 else ""),
    )
    ax_g.set_xlabel("time (forward of one stage = 1 unit)")
    ms = [m for m in range(1, 17) if schedule != "interleaved_1f1b" or m % num_stages == 0]
    ax_b.plot(ms, [bubble(replay(m)[1])["bubble"] for m in ms], "k.-", label="replayed")
    ax_b.plot(ms, [schedules.bubble_fraction(num_stages, m, v) for m in ms], "g--", label="(p−1)/(v·m+p−1)")
    if measured is not None and num_stages == 2 and v == 1:
        rows = measured.to_dict("records") if hasattr(measured, "to_dict") else measured
        ax_b.errorbar(
            [r["microbatches"] for r in rows],
            [r["bubble"] for r in rows],
            yerr=[r.get("bubble_iqr", 0) / 2 for r in rows],
            fmt="o",
            color="tab:red",
            label="measured, p = 2",
        )
    ax_b.plot([num_microbatches], [b], "r*", ms=14)
    ax_b.set(xlabel="micro-batches m", ylabel="bubble (idle share)", ylim=(0, 1), title="bubble")
    ax_b.legend(fontsize=7)
    ax_b.grid(alpha=0.3)
    peaks = schedules.peak_activations(sched)
    caption = (
        f"{schedule}: bubble {b:.2f} of the step (formula {formula:.2f}"
        + (", which leaves out the messages" if p2p_ratio else "")
        + f"); micro-batches in flight per rank "
        f"{peaks}; {sum(a.op == 'send_forward' for r in sched for a in r)} activations sent per step."
    )
    return fig, caption


def pipeline_explorer(measured=None):
    """Schedule, stages, micro-batches, chunks, backward/forward and message cost -> Gantt chart and bubble;
    ``measured`` (the lesson's bubble sweep at p = 2) is marked when p = 2."""
    import ipywidgets as W

    controls = dict(
        schedule=W.Dropdown(options=["gpipe", "1f1b", "interleaved_1f1b"], value="1f1b", description="schedule"),
        num_stages=W.IntSlider(value=2, min=2, max=8, description="stages p"),
        num_microbatches=W.IntSlider(value=4, min=1, max=16, description="micro-batches"),
        num_chunks=W.IntSlider(value=2, min=2, max=4, description="chunks v"),
        backward_ratio=W.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.5, description="B / F"),
        p2p_ratio=W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05, description="message / F"),
    )
    return _wire(controls, lambda **v: pipeline_figure(measured=measured, **v))
