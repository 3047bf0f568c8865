"""The planner's search space holds what engineers choose: uneven pipeline stages (Megatron's split of Llama 3's
126 layers), every interleaving depth Strategy accepts, Megatron's rank order and the distributed optimizer's
overlapped all-gather — each priced by the fast path exactly as ``sim.predict`` prices it; and a TOML the planner
writes is priced by ``simlib train --dry-run`` exactly as the planner priced it."""

from __future__ import annotations

import dataclasses

import pytest

from simlib import sim
from simlib.sim import plan_result, planner
from simlib.sim.planner_cost import FastPricer


def test_every_interleaving_depth_strategy_accepts_is_searched():
    # 126 layers on 8 stages: 126 + 2 (embedding and loss counted as layers) split into 16, 32 and 64 chunks
    assert planner.depths(126, 8, 8) == [2, 4, 8]
    assert planner.depths(80, 4, 8) == [2, 4, 5]  # 80 = 4 · 2 · 10 = 4 · 4 · 5 = 4 · 5 · 4
    m = plan_result.resolve_model("405B")
    for v in planner.depths(126, 8, 8):  # each one is a valid Strategy
        sim.Strategy(dp=1, tp=8, pp=8, num_micro_batches=8, schedule="interleaved", virtual_stages=v).validate(model=m)


def test_uneven_stages_split_as_megatron_does():
    assert planner.uneven_stages(126, 16) == dict(first_stage_layers=7, last_stage_layers=7)  # Llama 3 405B
    assert planner.uneven_stages(126, 8) == dict(first_stage_layers=15, last_stage_layers=15)  # 15 + 6 · 16 + 15
    assert planner.uneven_stages(128, 16) == {}  # even already
    m = plan_result.resolve_model("405B")
    layouts = [
        layout for layout, _ in planner.candidates(m, sim.preset("h100"), 16384, 2048, dict(pp=(16,), tp=(8,), cp=(1,)))
    ]
    assert layouts and all(lay.get("first_stage_layers") == 7 for lay in layouts if lay["virtual_stages"] == 1)
    assert sim.Strategy(dp=128, tp=8, pp=16, first_stage_layers=7, last_stage_layers=7).stage_layers(126) == [7] + [
        8
    ] * 14 + [7]


def test_rank_orders_and_the_overlapped_all_gather_are_searched_when_asked():
    m = plan_result.resolve_model("8B")
    space = dict(pp=(2,), tp=(1,), cp=(1,), pipeline_outer=(False, True), param_gather_overlap=(True,))
    seen = {
        (lay.get("pipeline_outer", False), k.get("param_gather_overlap", False), k["zero_stage"], k["fsdp"])
        for lay, knobs in planner.candidates(m, sim.preset("h100"), 16, 64, space)
        for k in knobs
    }
    assert {True, False} == {outer for outer, *_ in seen}
    assert all(pgo == (z in (1, 2) and not fsdp) for _, pgo, z, fsdp in seen)


ENDS = dict(first_stage_layers=15, last_stage_layers=15)


@pytest.mark.parametrize(
    "changes",
    [
        dict(pp=16, first_stage_layers=7, last_stage_layers=7, dp=128, num_micro_batches=16),
        dict(pp=8, schedule="interleaved", virtual_stages=4, dp=256, num_micro_batches=8),
        dict(pp=8, dp=256, num_micro_batches=8, zero_stage=1, overlap=True, param_gather_overlap=True, **ENDS),
        dict(pp=8, dp=256, num_micro_batches=8, pipeline_outer=True, zero_stage=1, overlap=True, **ENDS),
    ],
)
def test_new_plans_are_priced_by_the_fast_path_as_predict(changes):
    m, hw = plan_result.resolve_model("405B"), sim.preset("h100")
    s = sim.Strategy(tp=8, micro_batch=1, attention="flash", recompute="full", **changes).validate(16384, m, hw)
    fast = FastPricer(m, hw).price(s, s.global_batch)
    p = sim.predict(m, hw, s)
    assert fast["step_time"] == pytest.approx(p.step_time, rel=1e-9)
    assert fast["dp_exposed"] == pytest.approx(p.breakdown["dp_exposed"], rel=1e-9, abs=1e-12)


def test_a_toml_the_planner_writes_is_priced_by_the_dry_run_as_the_planner_priced_it(tmp_path):
    """Before: the TOML named no machine (the dry run priced it on the CPU box) and the dry run priced the course
    GPT's attention unfused where the planner priced it fused: 1.15 s against 0.23 ms."""
    from simlib import cli, cli_train
    from simlib.dry_run import sim_model, strategy_for
    from simlib.projects.gpt.task import GPTTask

    task = GPTTask(seq_len=256, hidden=256, num_layers=4, num_heads=4, global_batch=32)
    space = dict(tp=(1, 2), pp=(1,), cp=(1,), max_micro_batch=2, recompute=("none",), zero_stage=(0, 1))
    r = sim.plan(sim_model(task), "h100", devices=8, global_batch=32, task=task, trainer_only=True, space=space)
    entry = r.best_runnable
    path = tmp_path / "plan.toml"
    path.write_text(r.toml(entry))
    spec = cli_train.resolve(cli.build_parser().parse_args(["train", "--config", str(path), "--dry-run"]))
    (plan,) = spec.plans.values()
    s = strategy_for(plan, spec.task, spec.optim)
    differ = [f.name for f in dataclasses.fields(s) if getattr(s, f.name) != getattr(entry["strategy"], f.name)]
    assert differ == [] and spec.hardware == "h100"
    hw = sim.preset(spec.hardware)
    p = sim.predict(sim_model(spec.task), hw, s, processes=min(spec.world_size, hw.devices_per_node))
    assert p.step_time == pytest.approx(entry["step_time"], rel=1e-9)
    assert p.memory["total"] == pytest.approx(entry["memory"]["total"], rel=1e-12)
