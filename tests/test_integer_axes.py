"""Axes that count (ranks, experts, degrees, micro-batches) carry whole-number ticks only: no "rank -0.5" or
"expert 0.25" in the explorers' figures or the shared plots (matplotlib's default locator puts them there)."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from simlib import plots, widgets  # noqa: E402

# the label of an axis that counts starts with what it counts ("MB per rank" does not count ranks)
COUNTS = re.compile(
    r"^(rank|expert|cp|ep|world size|tensor-parallel degree|micro-batch|accumulation steps|"
    r"all-reduces|token|score entries)\b"
)


def fractional_ticks(fig) -> list:
    """(axis label, ticks) for every counting axis of ``fig`` with a tick that is not a whole number."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            label = axis.get_label_text()
            if not COUNTS.match(label) or axis.get_scale() != "linear":
                continue
            lo, hi = sorted(lim)
            ticks = [float(t) for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]
            if any(abs(t - round(t)) > 1e-9 for t in ticks):
                out.append((label, ticks))
    plt.close(fig)
    return out


FIGURES = {
    "ring, 2 ranks": lambda: widgets.ring_figure(2, 1),
    "buckets, 8 ranks": lambda: widgets.bucket_figure(25, global_batch=256, world_size=8),
    "accumulation k=1": lambda: widgets.accumulation_figure(512, 1, 2, no_sync=True, width=256, depth=3),
    "pipeline p=2": lambda: widgets.pipeline_figure("1f1b", 2, 4),
    "tensor t=1": lambda: widgets.tp_figure(4, 64, 512, 1),
    "context cp=4": lambda: widgets.context_figure(seq=4096, cp=4),
    "context cp=2": lambda: widgets.context_figure(seq=1024, cp=2, heads=4, head_dim=32, layout="contiguous"),
    "experts ep=4": lambda: widgets.moe_figure(),
    "experts ep=2": lambda: widgets.moe_figure(num_experts=8, ep=2, top_k=2, tokens=4096, skew=2.0),
    "experts ep=1": lambda: widgets.moe_figure(num_experts=4, ep=1),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_explorer_figures_count_in_whole_numbers(name):
    fig, _ = FIGURES[name]()
    assert fractional_ticks(fig) == [], name


def test_integer_ticks_on_one_bar_and_on_two():
    for n in (1, 2):
        fig, ax = plt.subplots()
        ax.bar(range(n), [1.0] * n)
        ax.set_xlabel("rank")
        assert fractional_ticks(fig) != []  # matplotlib's default: -0.4 ... 0.4 for one bar, -0.25 ... 1.25 for two
        fig, ax = plt.subplots()
        ax.bar(range(n), [1.0] * n)
        ax.set_xlabel("rank")
        plots.integer_ticks(ax)
        assert fractional_ticks(fig) == []


def test_shared_plots_count_in_whole_numbers():
    table = pd.DataFrame(dict(world_size=[1, 2], speedup=[1.0, 1.3], efficiency=[1.0, 0.65], comm_fraction=[0, 0.2]))
    assert fractional_ticks(plots.scaling_figure(table)) == []
    spans = pd.DataFrame(
        [
            dict(rank=r, step=1, kind="forward", name="forward", start=0.0, end=0.01, duration=0.01, warmup=False)
            for r in (0, 1)
        ]
    )
    assert fractional_ticks(plots.gantt(spans).figure) == []
