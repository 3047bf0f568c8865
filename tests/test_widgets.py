"""The lesson explorers: each figure is a pure function of its controls, drawn from the library's own code.

No browser here (tests/test_browser.py renders one in JupyterLab): the figures are built with Agg, their numbers
compared with the functions the lessons teach, and each explorer is built once (its first draw runs).
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from simlib import widgets  # noqa: E402
from simlib.parallel import schedules  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_trace_ends_with_every_rank_holding_the_sum(n):
    states = widgets.ring_trace(n)
    assert len(states) == 1 + 2 * (n - 1)
    after_rs = states[n - 1]["holds"]
    for r in range(n):  # after reduce-scatter rank r holds chunk (r + 1) % n complete, as ring_reduce_scatter_ returns
        assert after_rs[r][(r + 1) % n] == frozenset(range(n))
    assert all(c == frozenset(range(n)) for row in states[-1]["holds"] for c in row)
    assert states[-1]["sent"] == 2 * (n - 1)  # each rank sent 2(n-1) chunks of 1/n: 2(n-1)/n of the tensor


def test_ring_figure_and_bad_inputs():
    fig, caption = widgets.ring_figure(4, 3)
    assert "reduce-scatter, step 3 of 3" in caption and "3/4 of the tensor" in caption
    with pytest.raises(ValueError):
        widgets.ring_figure(4, 7)
    with pytest.raises(ValueError):
        widgets.ring_trace(1)


def test_alpha_beta_figure_uses_the_lessons_model_and_marks_measured_points():
    from simlib.collectives import alpha_beta_time

    measured = [
        dict(op="all_reduce", world_size=2, bytes=2**20, time=3e-3, busbw=3.5e8),
        dict(op="all_reduce", world_size=4, bytes=2**20, time=9e-3, busbw=2e8),
    ]
    fig, caption = widgets.alpha_beta_figure(2**20, 2, 1e-3, 1e9, measured=measured)
    t = float(alpha_beta_time(2**20, 2, 1e-3, 1e-9))
    assert f"{t * 1e3:.3g} ms" in caption
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "measured all_reduce" in labels  # only the 2-rank row is drawn
    assert (
        sum(len(line.get_xdata()) for line in fig.axes[0].get_lines() if line.get_label().startswith("measured")) == 1
    )


def test_bucket_figure_counts_make_buckets_and_marks_the_sweep():
    from simlib.models import MLP
    from simlib.parallel.data import make_buckets

    fig, caption = widgets.bucket_figure(
        0.5,
        width=256,
        depth=3,
        global_batch=256,
        world_size=2,
        measured=pd.DataFrame(
            [dict(mode="bucket", bucket_cap_mb=0.5, step_ms=30.0), dict(mode="ddp", bucket_cap_mb=0.5, step_ms=31.0)]
        ),
    )
    buckets = len(make_buckets(MLP(256, 3).parameters(), 0.5))
    assert f"{buckets} all-reduce(s) per step" in caption
    measured = [line for ax in fig.axes for line in ax.get_lines() if line.get_label().startswith("measured")]
    assert len(measured) == 1 and list(measured[0].get_ydata()) == [30.0]
    with pytest.raises(ValueError):
        widgets.bucket_figure(1.0, global_batch=10, world_size=4)


def test_accumulation_figure_memory_and_messages():
    memory = pd.DataFrame(dict(micro_batch=[16, 32, 64], peak_mb=[1.0, 2.0, 4.0]))
    _, with_sync = widgets.accumulation_figure(
        512,
        4,
        2,
        no_sync=True,
        width=256,
        depth=3,
        measured_memory=memory,
        measured_all_reduces={(4, True): 1.0, (4, False): 4.0},
    )
    _, without = widgets.accumulation_figure(512, 4, 2, no_sync=False, width=256, depth=3)
    assert "× 64:" in with_sync and "1 all-reduce(s)" in with_sync and "4 all-reduce(s)" in without
    with pytest.raises(ValueError, match="does not split"):
        widgets.accumulation_figure(100, 8, 2)


@pytest.mark.parametrize("name,p,m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("interleaved_1f1b", 2, 4)])
def test_pipeline_figure_bubble_matches_the_formula_without_message_cost(name, p, m):
    fig, caption = widgets.pipeline_figure(name, p, m, num_chunks=2)
    v = 2 if name == "interleaved_1f1b" else 1
    formula = schedules.bubble_fraction(p, m, v)
    assert f"bubble {formula:.2f} of the step (formula {formula:.2f})" in caption


def test_pipeline_figure_marks_measured_bubbles_at_p2_and_says_what_is_wrong():
    measured = pd.DataFrame(dict(microbatches=[1, 2, 4], bubble=[0.52, 0.4, 0.3], bubble_iqr=[0.02, 0.02, 0.02]))
    fig, _ = widgets.pipeline_figure("1f1b", 2, 4, measured=measured)
    assert any("measured" in t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    fig, caption = widgets.pipeline_figure("1f1b", 2, 4, p2p_ratio=0.3)
    assert "leaves out the messages" in caption
    with pytest.raises(ValueError, match="multiple"):
        widgets.pipeline_figure("interleaved_1f1b", 4, 6)


def test_tp_figure_volume_is_comm_volume():
    from simlib.parallel.tensor import comm_volume

    fig, caption = widgets.tp_figure(
        4, 64, 512, 2, measured=pd.DataFrame([dict(seq=64, batch=4, hidden=512, measured_MB=0.524288)])
    )
    assert f"{comm_volume(4, 64, 512, 2)['step_payload_bytes'] / 1e6:.3g} MB all-reduced" in caption
    with pytest.raises(ValueError):
        widgets.tp_figure(4, 64, 510, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: widgets.ring_explorer(),
        lambda: widgets.alpha_beta_explorer(measured=[], fits={2: dict(alpha=5e-4, bandwidth=5e8)}),
        lambda: widgets.bucket_explorer(width=256, depth=3, global_batch=256),
        lambda: widgets.accumulation_explorer(width=256, depth=3),
        lambda: widgets.pipeline_explorer(),
        lambda: widgets.tp_explorer(batch=4, seq=64, hidden=512),
    ],
    ids=["ring", "alpha_beta", "bucket", "accumulation", "pipeline", "tp"],
)
def test_explorers_build_and_draw(make):
    box = make()
    assert box.children and "not a valid choice" not in box.children[1].value
    assert box.children[1].value  # the caption of the first draw


def test_memory_bars_label_above_their_measured_marker_and_title_the_precision_drawn():
    import torch

    from simlib import sim

    spec = sim.from_module(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), name="tiny")
    measured = [dict(zero_stage=s, dp=4, weights=3e4, gradients=3e4, optimizer=6e4) for s in range(4)]  # 0.12 MB
    ax = widgets.draw_memory(spec, 4, 1, precision="fp32", measured=measured)
    assert "fp32" in ax.get_title()
    for text in ax.texts:  # each value sits at or above the measured marker of its bar, offset upwards
        assert text.xy[1] >= 0.12 - 1e-9 and text.xyann[1] > 0, (text.get_text(), text.xy)
    plt.close("all")
