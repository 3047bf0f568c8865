"""Causes of the cluster-scale errors found in the cost model (``benchmarks/sim_scale.py``), each checked as a
behaviour: what the term depends on, what it does not, and that a fitted term reads the fit half only."""
import csv

import pytest

from simlib import sim
from simlib.sim import cluster_ops, scale_runs
from simlib.sim.cost import gpt_stage


def _moe_strategy(ep, **kw):
    return sim.Strategy(dp=ep, ep=ep, attention="flash", micro_batch=1, num_micro_batches=4, zero_stage=1, **kw)


def test_moe_host_cost_is_per_local_expert_not_per_layer():
    """The host's launches grow with the experts a rank holds (TE GroupedLinear: one GEMM per local expert), so
    spreading the same experts over 4× the ranks cuts the term 4×; a calibrated CPU box has no such term."""
    m, hw = sim.llama_size("qwen3-30b-a3b"), sim.dgx_h100()
    h8, h32 = (cluster_ops.moe_host_overhead(m, _moe_strategy(ep), hw) for ep in (8, 32))
    assert h8 == pytest.approx(cluster_ops.MOE_HOST_PER_LOCAL_EXPERT * 128 / 8)
    assert h8 == pytest.approx(4 * h32)
    assert cluster_ops.moe_host_overhead(m, _moe_strategy(8), sim.cpu_box()) == 0.0
    assert cluster_ops.moe_host_overhead(sim.llama_size("llama3-8b"), _moe_strategy(8), hw) == 0.0
    # gpt_stage charges it once per MoE layer pass, a third forward and two thirds backward
    s = _moe_strategy(8)
    saved = cluster_ops.MOE_HOST_PER_LOCAL_EXPERT
    try:
        with_it = gpt_stage(m, hw, s)
        cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = 0.0
        without = gpt_stage(m, hw, s)
    finally:
        cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = saved
    layers = m.moe_layers
    assert with_it["forward"] - without["forward"] == pytest.approx(layers * h8 / 3)
    assert with_it["backward"] - without["backward"] == pytest.approx(layers * 2 * h8 / 3)


def test_moe_host_term_is_fitted_on_the_fit_half_only(tmp_path):
    """Changing every test row's measurement leaves the fitted term unchanged; it is the stated constant."""
    fitted = scale_runs.fit_moe_host_per_expert()
    assert fitted == pytest.approx(cluster_ops.MOE_HOST_PER_LOCAL_EXPERT, rel=0.02)
    with open(scale_runs.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["split"] == "test":
            r["measured"] = str(float(r["measured"]) * 3)
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert scale_runs.fit_moe_host_per_expert(path) == fitted
