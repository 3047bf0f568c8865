"""Timeline tables: hand-built spans give hand-computed summaries; the real recorder fills the same shape."""

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from simlib import plots  # noqa: E402
from simlib.timeline import COLUMNS, Timeline, step_times, summarize, to_frame  # noqa: E402


def _rows():
    rows = []
    # two ranks, three steps (step 0 is warm-up); step s on rank r runs [10s + r*0.1, 10s + 2 + r*0.1]
    for r in (0, 1):
        for s in range(3):
            t = 10.0 * s + 0.1 * r
            rows.append(
                dict(rank=r, step=s, kind="step", name=f"step {s}", start=t, end=t + 2.0, duration=2.0, warmup=s == 0)
            )
            rows.append(
                dict(rank=r, step=s, kind="forward", name="forward", start=t, end=t + 0.5, duration=0.5, warmup=s == 0)
            )
            rows.append(
                dict(rank=r, step=s, kind="comm", name="comm", start=t + 1.0, end=t + 1.5, duration=0.5, warmup=s == 0)
            )
    return rows


def test_step_times_and_summary_by_hand():
    df = to_frame(_rows())
    assert list(df.columns) == COLUMNS
    times = step_times(df)
    assert list(times.index) == [1, 2]
    assert times.tolist() == pytest.approx([2.1, 2.1])  # first start to last end over ranks
    s = summarize(df)
    assert s["step_time"] == pytest.approx(2.1) and s["steps"] == 2
    assert s["forward_time"] == pytest.approx(0.5) and s["comm_time"] == pytest.approx(0.5)
    assert s["comm_fraction"] == pytest.approx(0.5 / 2.1)
    assert s["backward_time"] == 0.0


def test_summary_without_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="no measured steps"):
        summarize(to_frame([]))


def test_recorder_fills_the_table():
    tl = Timeline(rank=0, warmup=1)
    for step in range(3):
        with tl.step(step):
            with tl.span("forward"):
                sum(range(1000))
            with tl.span("comm", name="all_reduce"):
                pass
    df = tl.frame()
    assert set(df["kind"]) == {"step", "forward", "comm"}
    assert df[df["kind"] == "step"]["warmup"].tolist() == [True, False, False]
    assert (df["duration"] >= 0).all() and df["start"].min() == 0.0
    assert summarize(df)["steps"] == 2
    with pytest.raises(ValueError, match="unknown span kind"):
        with tl.span("lunch"):
            pass


def test_gantt_and_scaling_figure(tmp_path):
    ax = plots.gantt(to_frame(_rows()))
    assert "step 1" in ax.get_title()
    assert len(ax.patches) == 6  # 2 ranks x (step bar + forward + comm)
    table = pd.DataFrame(
        dict(
            world_size=[1, 2, 4],
            speedup=[1.0, 1.7, 1.5],
            efficiency=[1.0, 0.85, 0.37],
            comm_fraction=[0.0, 0.1, 0.3],
            baseline=[None, None, None],
        )
    )
    table.attrs["cores"] = 2
    fig = plots.scaling_figure(table, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("oversubscribed" in t for t in labels) and "ideal (linear)" in labels


def test_exposed_comm_counts_only_what_compute_does_not_hide():
    rows = [
        dict(rank=0, step=0, kind="step", name="s", start=0.0, end=4.0, duration=4.0, warmup=False),
        dict(rank=0, step=0, kind="backward", name="b", start=0.0, end=2.0, duration=2.0, warmup=False),
        # two async all-reduces: [1, 2.5] half hidden by backward, [1.5, 3] overlaps the first
        dict(rank=0, step=0, kind="comm", name="c1", start=1.0, end=2.5, duration=1.5, warmup=False),
        dict(rank=0, step=0, kind="comm", name="c2", start=1.5, end=3.0, duration=1.5, warmup=False),
    ]
    s = summarize(to_frame(rows, relative=False))
    assert s["comm_time"] == pytest.approx(3.0)  # the spans add up
    assert s["exposed_comm_time"] == pytest.approx(1.0)  # the step waits only for [2, 3]
    assert s["exposed_comm_fraction"] == pytest.approx(0.25)


def test_a_blocking_collective_inside_a_compute_span_is_exposed():
    """A comm span opened inside the optimizer span (the non-finite check's all-reduce) is cut out of it: the
    optimizer is recorded as the pieces around it, and the collective counts as exposed, as in a profiler trace."""
    import time

    tl = Timeline(rank=0)
    with tl.step(0):
        with tl.span("optimizer"):
            time.sleep(0.01)
            with tl.span("comm", name="non-finite check"):
                with tl.span("comm", name="inner"):  # nested comm: cut once, by the outermost
                    time.sleep(0.005)
                time.sleep(0.005)
            time.sleep(0.01)
    df = tl.frame()
    opt, comm = df[df["kind"] == "optimizer"], df[(df["kind"] == "comm") & (df["name"] == "non-finite check")]
    assert len(opt) == 2 and len(comm) == 1
    assert opt["end"].iloc[0] == comm["start"].iloc[0] and opt["start"].iloc[1] == comm["end"].iloc[0]
    s = summarize(df)
    assert s["exposed_comm_time"] == pytest.approx(float(comm["duration"].iloc[0]))
    assert s["optimizer_time"] == pytest.approx(float(opt["duration"].sum())) and s["optimizer_time"] < 0.03
