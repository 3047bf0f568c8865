"""Processor sharing (simlib.sim.cpu_share): on a CPU box whose ranks outnumber its cores, a step is the larger of
its critical path with a core per rank and the contended step without its bubble; GPUs are untouched. And the
memory model's kept values take the compute dtype's bytes. Pure arithmetic, a second or two."""

from __future__ import annotations

import dataclasses

import pytest

from simlib import sim
from simlib.sim.memory import activation_bytes_per_layer

MODEL = dataclasses.replace(sim.gpt(4, 128, 4, seq_len=64, vocab=1024), dropout=False)  # the course GPT's shape


def _fp32(**kw):
    return sim.Strategy(dtype="fp32", optimizer="adam", **kw)


@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=4, micro_batch=8),
        dict(pp=4, micro_batch=32),
        dict(pp=4, micro_batch=8, num_micro_batches=4),
        dict(dp=2, tp=2, micro_batch=16),
    ],
)
def test_the_step_is_the_larger_of_the_two_bounds(kw):
    hw = sim.cpu_box()  # 2 cores, 4 processes: they share
    s = _fp32(**kw)
    assert hw.own_cores(4) == 2 and hw.own_cores(2) is None
    p = sim.predict(MODEL, hw, s)
    contended = sim.predict(MODEL, hw.with_(cores=None), s)  # no sharing term: every rank at the 4-process rate
    alone = sim.predict(MODEL, hw, s, processes=2)  # a core per rank
    idle = contended.bubble + contended.breakdown["stage_idle"]  # the bubble and the lighter stages beside the slowest
    assert p.step_time == pytest.approx(max(alone.step_time, contended.step_time - idle), rel=1e-12)
    assert (contended.breakdown["stage_idle"] > 0) == (s.pp > 1)  # the last stage holds the head: the slowest
    assert p.step_time <= contended.step_time * (1 + 1e-12)
    assert p.step_time == pytest.approx(p.compute + p.exposed_comm + p.bubble + p.optimizer, rel=1e-12)
    assert p.breakdown["shared_cores"] in ("critical path", "cores' total work")
    assert p.memory == contended.memory


def test_a_pipeline_gives_its_bubble_away_and_data_parallel_does_not():
    hw = sim.cpu_box()
    pipe = sim.predict(MODEL, hw, _fp32(pp=4, micro_batch=32))
    contended = sim.predict(MODEL, hw.with_(cores=None), _fp32(pp=4, micro_batch=32))
    assert contended.bubble > 0 and pipe.step_time < contended.step_time
    dp = sim.predict(MODEL, hw, _fp32(dp=4, micro_batch=8))
    assert dp.breakdown["shared_cores"] == "cores' total work"
    assert dp.step_time == pytest.approx(sim.predict(MODEL, hw.with_(cores=None), _fp32(dp=4, micro_batch=8)).step_time)


def test_gpus_and_a_core_per_process_have_no_sharing_term():
    h100 = sim.preset("h100")
    assert h100.own_cores(8) is None
    p = sim.predict(sim.gpt_size("1.3B"), h100, sim.Strategy(dp=2, tp=4, pp=1, micro_batch=4))
    assert "shared_cores" not in p.breakdown
    assert "shared_cores" not in sim.predict(MODEL, sim.cpu_box(), _fp32(dp=2, micro_batch=16)).breakdown


def test_the_planner_prices_sharing_as_predict_and_its_top_k_is_the_full_search():
    hw = sim.cpu_box()
    space = dict(
        zero_stage=(0,),
        recompute=("none", "full"),
        schedule=("1f1b",),
        sequence_parallel=(False,),
        num_micro_batches=(1, 4),
    )
    full = sim.plan(MODEL, hw, devices=4, global_batch=32, dtype="fp32", space=space)
    assert not full.exact and len(full.ranked) > 10
    for e in full.ranked:
        p = sim.predict(MODEL, hw, e["strategy"])
        assert e["step_time"] == pytest.approx(p.step_time, rel=1e-9), sim.planner.label(e["strategy"])
        assert e["bubble"] == pytest.approx(p.bubble, rel=1e-9, abs=1e-12)
    top = sim.plan(MODEL, hw, devices=4, global_batch=32, dtype="fp32", space=space, top=3)
    assert [e["strategy"] for e in top.ranked[:3]] == [e["strategy"] for e in full.ranked[:3]]


def test_fp32_keeps_every_value_in_four_bytes():
    for recompute in ("none", "selective", "full", "op"):
        half = activation_bytes_per_layer(MODEL, 8, 2, recompute, True, "unfused", 2)
        assert activation_bytes_per_layer(MODEL, 8, 2, recompute, True, "unfused", 4) == pytest.approx(2 * half)
    dropout = dataclasses.replace(MODEL, dropout=True)  # the masks stay 1 byte: less than twice
    assert activation_bytes_per_layer(dropout, 8, 1, value_bytes=4) < 2 * activation_bytes_per_layer(dropout, 8, 1)
    s, b, h, a = 64, 8, 128, 4  # Korthikanti's table in mixed precision, as before
    assert activation_bytes_per_layer(dropout, b) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert sim.memory_per_device(MODEL, _fp32(dp=4, micro_batch=8))["activations"] == pytest.approx(
        4 * activation_bytes_per_layer(MODEL, 8, value_bytes=4) + 4.0 * 8 * 64 * 1024
    )
