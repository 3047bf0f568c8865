"""The explorer of lesson 03: micro-batches -> memory and messages."""

from __future__ import annotations

import numpy as np

from ._common import _figure, _mb, _wire


def accumulation_figure(
    global_batch: int,
    accumulation_steps: int,
    world_size: int = 2,
    no_sync: bool = True,
    width: int = 1024,
    depth: int = 4,
    measured_memory=None,
    measured_all_reduces=None,
):
    """Accumulation steps k -> micro-batch size, peak memory and all-reduces per optimizer step.

    Memory: weights + gradients of the lesson's MLP, plus activations growing with the micro-batch: the slope
    fitted to ``measured_memory`` (rows ``micro_batch``, ``peak_mb`` from ``accumulate.peak_memory``) when given,
    else (depth + 1)·width floats per sample. Messages: DDP's buckets (``parallel.data.make_buckets``, 25 MB)
    once per step with ``no_sync``, once per micro-batch without. ``measured_all_reduces``:
    {(k, no_sync): all-reduces per step} measured by the lesson. Returns (figure, caption).
    """
    from ..models import MLP
    from ..parallel.data import make_buckets

    per_rank, rest = divmod(global_batch, world_size * accumulation_steps)
    if rest or per_rank < 1:
        raise ValueError(
            f"a global batch of {global_batch} does not split into {accumulation_steps} micro-batches "
            f"on each of {world_size} ranks"
        )
    model = MLP(width, depth)
    params = sum(p.numel() for p in model.parameters())
    fixed_mb = _mb(2 * 4 * params)  # fp32 weights + gradients
    buckets = len(make_buckets(model.parameters(), 25.0))
    if measured_memory is not None and len(measured_memory) >= 2:
        rows = measured_memory.to_dict("records") if hasattr(measured_memory, "to_dict") else measured_memory
        slope, intercept = np.polyfit([r["micro_batch"] for r in rows], [r["peak_mb"] for r in rows], 1)
        source = "fitted to the measured points"
    else:
        rows, slope, intercept = [], _mb((depth + 1) * width * 4), 0.0
        source = "(depth + 1)·width floats per sample"
    fig, (ax_m, ax_c) = _figure()
    batches = np.geomspace(1, max(global_batch // world_size, 2), 60)
    ax_m.semilogx(batches, fixed_mb + intercept + slope * batches, "k-", label=f"model: activations {source}")
    ax_m.axhline(fixed_mb, color="gray", ls="--", label=f"weights + gradients {fixed_mb:.1f} MB")
    if rows:
        ax_m.plot(
            [r["micro_batch"] for r in rows],
            [fixed_mb + r["peak_mb"] for r in rows],
            "o",
            color="tab:blue",
            label="measured (+ weights, gradients)",
        )
    mem = fixed_mb + intercept + slope * per_rank
    ax_m.plot([per_rank], [mem], "r*", ms=14, label=f"micro-batch {per_rank}")
    ax_m.set(xlabel="micro-batch size per rank", ylabel="MB per rank", title="peak memory follows the micro-batch")
    ks = [k for k in (1, 2, 4, 8, 16, 32) if global_batch % (world_size * k) == 0]
    for flag, style in ((False, "s--"), (True, "o-")):
        ax_c.plot(ks, [buckets * (1 if flag else k) for k in ks], style, label=f"no_sync={flag}")
    for (k, flag), count in (measured_all_reduces or {}).items():
        ax_c.plot([k], [count], "x", color="k", ms=10, mew=2, label=f"measured (k={k}, no_sync={flag})")
    ax_c.plot([accumulation_steps], [buckets * (1 if no_sync else accumulation_steps)], "r*", ms=14, label="yours")
    ax_c.set(
        xlabel="accumulation steps k",
        ylabel="all-reduces per optimizer step",
        xscale="log",
        title=f"messages: {_mb(4 * params):.1f} MB of gradients each",
    )
    ax_c.set_xscale("log", base=2)
    for ax in (ax_m, ax_c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    sends = buckets * (1 if no_sync else accumulation_steps)
    caption = (
        f"global batch {global_batch} = {world_size} ranks × {accumulation_steps} micro-batches × {per_rank}: "
        f"~{mem:.1f} MB per rank at the peak; {sends} all-reduce(s) per optimizer step "
        f"({sends * _mb(4 * params) / buckets:.1f} MB sent into them)."
    )
    return fig, caption


def accumulation_explorer(measured_memory=None, measured_all_reduces=None, width: int = 1024, depth: int = 4):
    import ipywidgets as W

    controls = dict(
        global_batch=W.SelectionSlider(options=[2**i for i in range(4, 13)], value=1024, description="global batch"),
        accumulation_steps=W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=4, description="k"),
        world_size=W.SelectionSlider(options=[1, 2, 4, 8], value=2, description="ranks"),
        no_sync=W.Checkbox(value=True, description="no_sync"),
    )
    return _wire(
        controls,
        lambda **v: accumulation_figure(
            width=width, depth=depth, measured_memory=measured_memory, measured_all_reduces=measured_all_reduces, **v
        ),
        columns=2,
        width="400px",
    )
