"""Replays of the executors' schedule values give timeline tables; pipeline step times match the bubble formula."""

import pytest

from simlib import sim
from simlib.parallel import schedules
from simlib.sim import replay
from simlib.timeline import COLUMNS, summarize


@pytest.mark.parametrize("make", [schedules.gpipe, schedules.one_f_one_b])
def test_pipeline_replay_step_time_is_m_plus_p_minus_1(make):
    p, m, tf, tb = 4, 8, 1.0, 2.0
    df = replay.replay_pipeline(make(p, m), tf, tb)
    assert list(df.columns) == COLUMNS
    assert summarize(df.assign(warmup=False))["step_time"] == pytest.approx((m + p - 1) * (tf + tb))
    assert (df[df.kind == "forward"].groupby("rank").size() == m).all()


def test_interleaved_replay_shrinks_the_bubble():
    p, m, v = 4, 8, 2
    plain = replay.replay_pipeline(schedules.one_f_one_b(p, m), 1.0, 2.0)
    inter = replay.replay_pipeline(schedules.interleaved_1f1b(p, m, v), 1.0 / v, 2.0 / v)
    t_plain = plain[plain.kind == "step"].end.max()
    t_inter = inter[inter.kind == "step"].end.max()
    assert t_inter < t_plain
    assert t_inter == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v, rel=0.15)  # Narayanan et al.: bubble / v


def test_pipeline_replay_detects_a_deadlock():
    bad = schedules.one_f_one_b(2, 2)
    first_recv = next(a for a in bad[0] if a.op == "recv_backward")
    bad[0] = [first_recv] + [a for a in bad[0] if a is not first_recv]  # waits for a gradient before any forward
    with pytest.raises(ValueError, match="deadlock"):
        replay.replay_pipeline(bad, 1.0, 2.0)


def test_data_parallel_replay_matches_predict():
    from simlib.models import MLP

    model = sim.from_module(MLP(256, 3))
    hw = sim.cpu_box()
    s = sim.Strategy(dp=2, micro_batch=64, num_micro_batches=2, bucket_bytes=2**18, dtype="fp32", optimizer="sgd")
    df = replay.replay_data_parallel(model, hw, s, steps=3, warmup=1)
    assert list(df.columns) == COLUMNS and set(df["rank"]) == {0, 1}
    assert summarize(df)["step_time"] == pytest.approx(sim.predict(model, hw, s).step_time)
    overlapped = replay.replay_data_parallel(model, hw, s.replace(overlap=True), steps=3, warmup=1)
    assert summarize(overlapped)["step_time"] <= summarize(df)["step_time"]


def test_per_stage_durations_and_the_measured_pipeline_prediction():
    from simlib.sim import validate

    # stage 1 twice as slow: the slow stage sets the pace, (m + p - 1) steps of the slow one roughly
    df = replay.replay_pipeline(schedules.one_f_one_b(2, 4), [1.0, 2.0], [2.0, 4.0])
    assert df[df.kind == "step"].end.max() == pytest.approx(1.0 + 4 * 6.0 + 2.0)
    hw = sim.cpu_box()
    one, tl = validate.predict_pipeline(validate.RunConfig(2, 16, accumulation=4, pipeline="1f1b"), hw)
    two, _ = validate.predict_pipeline(validate.RunConfig(2, 16, accumulation=4, pipeline="gpipe"), hw)
    assert one > 0 and one == pytest.approx(two, rel=0.1)  # same bubble for equal stages; these differ a little
    assert list(tl.columns) == COLUMNS
