"""How the simulator places and prices experts and attention as Megatron-Core runs them: its expert grid (ep ranks
consecutive over tp × cp × dp), a deduplicating dispatcher (DeepEP / HybridEP), and Transformer Engine's cuDNN
attention on Hopper. Each test fails on the simulator before these were priced."""

import math

import pytest

from simlib import sim
from simlib.sim import scale_runs, topology
from simlib.sim.cost import gpt_stage
from simlib.sim.memory import stage_memory


def megatron(**kw):
    return sim.Strategy(pipeline_outer=True, attention="flash", micro_batch=1, num_micro_batches=8, **kw)


def test_megatron_expert_group_is_consecutive_ranks_whatever_tp():
    """tp 4 × dp 8 on 8-GPU nodes, ep 8: Megatron's expert grid (expert tensor parallelism 1) puts the 8 expert ranks
    on one node; the course's own mesh (dp × cp ranks, one tp rank) spreads them over four."""
    s = megatron(tp=4, pp=2, dp=8, ep=8, sequence_parallel=True)
    assert topology.group_ranks(s, "ep") == list(range(8))
    assert topology.placement(s, sim.dgx_h100(), "ep").nodes == 1
    assert topology.group_ranks(s, "expert_dp") == [0, 8, 16, 24]
    assert s.expert_dp == 4  # tp·dp·cp / ep
    course = s.replace(pipeline_outer=False)
    assert topology.placement(course, sim.dgx_h100(), "ep").nodes > 1 and course.expert_dp == 1


def test_expert_states_shard_over_the_expert_data_parallel_ranks():
    """Megatron's distributed optimizer shards the experts' states over the ranks holding the same experts: tp·dp/ep
    of them under its expert grid (4 here), not dp/ep (1): the states a rank holds fall accordingly."""
    m = sim.llama_size("qwen3-235b-a22b", seq_len=4096)
    s = megatron(tp=4, pp=2, dp=8, ep=8, sequence_parallel=True, zero_stage=1)
    folded, unfolded = stage_memory(m, s), stage_memory(m, s.replace(pipeline_outer=False))
    assert folded["optimizer"] < 0.5 * unfolded["optimizer"]


def test_remote_copy_share_counts_distinct_nodes():
    share = topology.remote_copy_share
    assert share(128, 8, 1) == 1.0 and share(64, 1, 8) == 1.0  # nothing crosses, or one copy per token
    # by hand: P(no expert of 8 on a node of 32 of 128) = prod (96 - i) / (128 - i)
    none = math.prod((96 - i) / (128 - i) for i in range(8))
    assert share(128, 8, 4) == pytest.approx(4 * (1 - none) / 8)
    assert 0.4 < share(128, 8, 4) < 0.5 and share(256, 8, 8) == pytest.approx(0.66, abs=0.01)
    assert share(8, 8, 8) == 1.0  # every node reached: no saving


def test_deepep_dispatch_is_cheaper_only_across_nodes():
    m, hw = sim.llama_size("qwen3-235b-a22b", seq_len=4096), sim.dgx_h100()
    across = megatron(tp=1, pp=2, dp=32, ep=32)  # four nodes
    inside = megatron(tp=1, pp=2, dp=32, ep=8)  # one node
    for s, cheaper in ((across, True), (inside, False)):
        a2a = gpt_stage(m, hw, s)["ep_comm"]
        deep = gpt_stage(m, hw, s.replace(ep_dispatcher="deepep"))["ep_comm"]
        assert (deep < 0.7 * a2a) if cheaper else deep == pytest.approx(a2a)
    with pytest.raises(ValueError, match="ep_dispatcher"):
        sim.Strategy(ep_dispatcher="nccl")


def test_cudnn_attention_is_faster_on_hopper_only():
    """cuDNN's fused attention (Transformer Engine's pick on Hopper+) runs at its measured H100 rate; on an A100,
    where no figure is given, at FlashAttention-2's."""
    m = sim.llama_size("llama3-8b", seq_len=16384)
    s = sim.Strategy(dp=8, attention="flash", micro_batch=1, num_micro_batches=4)
    for hw, faster in ((sim.dgx_h100(), True), (sim.dgx_a100(), False)):
        fa2 = gpt_stage(m, hw, s)["forward"]
        cudnn = gpt_stage(m, hw, s.replace(attention="cudnn"))["forward"]
        assert (cudnn < 0.9 * fa2) if faster else cudnn == pytest.approx(fa2)


def test_scale_runs_read_the_dispatcher_and_the_stack():
    rows = {r["id"]: r for r in scale_runs.load_rows()}
    zoo = rows["megatron-moe-modelzoo-000"]  # "dispatcher DeepEP" in its note
    model = sim.llama_size(zoo["model"], seq_len=zoo["seq_len"])
    s = scale_runs.strategy_of(zoo, model)
    assert s.ep_dispatcher == "deepep" and s.attention == "cudnn"
    assert scale_runs.strategy_of(rows["megatron-moe-modelzoo-003"], model).ep_dispatcher == "alltoall"  # "A2A"
    foundry = next(r for r in rows.values() if r["stack"] != "megatron-core")
    assert scale_runs.strategy_of(foundry, sim.llama_size(foundry["model"], seq_len=foundry["seq_len"])).attention == (
        "flash"
    )


def test_an_unknown_dispatcher_cell_is_refused(tmp_path):
    import csv

    with open(scale_runs.DATA, newline="") as f:
        header, row = list(csv.reader(f))[:2]
    assert row[header.index("dispatcher")] == ""  # a Megatron-Bridge row: not stated
    row[header.index("dispatcher")] = "nccl"
    bad = tmp_path / "runs.csv"
    with open(bad, "w", newline="") as f:
        csv.writer(f).writerows([header, row])
    with pytest.raises(ValueError, match="dispatcher"):
        scale_runs.load_rows(bad)
