"""Communication at scale as it runs: the data-parallel sync bucket by bucket (reduce-scatter under backward,
parameter all-gather under the next forward, in FP8 where the recipe keeps FP8 weights), NCCL's tree beside its
ring at thousands of nodes, in-network reduction, and the fabric as the cluster's own parameters — by hand."""

import math

import pytest

from simlib import sim
from simlib.sim import grad_sync, topology
from simlib.sim.grad_sync import BucketSync
from simlib.sim.hardware import NIC_EFFICIENCY, Hardware, Link

NVLINK = Link(alpha=0.0, bandwidth=100e9)  # made-up links: round numbers for hand computation
IB = Link(alpha=0.0, bandwidth=10e9)


def gpu(inter=IB, **fabric):
    """A made-up GPU: 100 TFLOP/s, 1 TB/s memory, 8 per node."""
    return Hardware(
        "toy", {"bf16": 100e12, "fp8": 200e12}, 80e9, 1e12, NVLINK, inter, 8, {"bf16": [(1e-6, 0.5), (1e6, 0.5)]}
    ).with_fabric(**fabric)


def test_bucketed_overlap_exposes_the_last_bucket_under_backward_and_the_first_under_forward():
    sync = BucketSync(after=(1.0,) * 4, after_ready=(0.25, 0.5, 0.75, 1.0))
    assert sync.exposed(0.0, 10.0, overlap=True) == pytest.approx(1.0)  # the last bucket, not the whole 4 s
    assert sync.exposed(0.0, 10.0, overlap=False) == pytest.approx(4.0)
    # a backward of 2 s: buckets ready at 0.5, 1, 1.5, 2; the channel runs 0.5–1.5, 1.5–2.5, 2.5–3.5, 3.5–4.5
    assert sync.exposed(0.0, 2.0, overlap=True) == pytest.approx(2.5)
    both = BucketSync((1.0,) * 4, (0.25, 0.5, 0.75, 1.0), before=(1.0,) * 4, before_need=(0.0, 0.25, 0.5, 0.75))
    assert both.exposed(10.0, 10.0, overlap=True) == pytest.approx(2.0)  # last reduce-scatter + first all-gather
    # a forward of 2 s needs the buckets at 0, 0.5, 1, 1.5; the gathers end at 1, 2, 3, 4: it waits 2.5 s
    assert both.exposed(2.0, 10.0, overlap=True) == pytest.approx(1.0 + 2.5)
    assert both.total == 8.0


def test_distributed_optimizer_moves_the_all_reduce_traffic_and_hides_all_but_two_buckets():
    model, hw = sim.gpt(8, 1024, 8, seq_len=1024, vocab=0), gpu()
    s = sim.Strategy(dp=16, tp=8, micro_batch=8, num_micro_batches=8, zero_stage=1, overlap=True, bucket_bytes=2e6)
    ddp = grad_sync.dp_sync(model, hw, s)
    dist = grad_sync.dp_sync(model, hw, s.replace(param_gather_overlap=True))
    pack = sum(6 * b / hw.mem_rate() for b in grad_sync.gradient_buckets(model, s))
    # reduce-scatter + all-gather is the all-reduce's traffic (α = 0)
    assert dist.total == pytest.approx(ddp.total, rel=1e-9)
    assert len(dist.before) == len(dist.after) == len(grad_sync.gradient_buckets(model, s)) > 2
    p = sim.predict(model, hw, s.replace(param_gather_overlap=True))
    t_fwd, t_bwd = p.breakdown["forward"] / 8, p.breakdown["backward"] / 8
    assert t_bwd > sum(dist.after) and t_fwd > sum(dist.before)  # compute long enough to hide the rest
    assert p.breakdown["dp_exposed"] == pytest.approx(dist.after[-1] + dist.before[0])
    assert p.breakdown["dp_exposed"] < 0.5 * (dist.total - pack)
    fp8 = grad_sync.dp_sync(model, hw, s.replace(dtype="fp8", param_gather_overlap=True, fp8_param_gather=True))
    assert sum(fp8.before) == pytest.approx(sum(dist.before) / 2)  # 1 byte a parameter instead of 2


def test_strategy_refuses_param_gather_options_that_do_not_exist():
    with pytest.raises(ValueError, match="zero_stage 1 or 2"):
        sim.Strategy(dp=2, param_gather_overlap=True)
    with pytest.raises(ValueError, match="dtype fp8"):
        sim.Strategy(dp=2, fp8_param_gather=True)


def test_tree_beats_the_ring_at_thousands_of_nodes_and_the_ring_wins_at_two():
    ib = Link(alpha=5e-6, bandwidth=40e9)
    hw, size = gpu(ib), 64e6
    for nodes, algorithm in ((2048, "tree"), (2, "ring")):
        place = topology.Placement("dp", nodes, 1, nodes)
        ring = 2 * (nodes - 1) * 5e-6 + 2 * (nodes - 1) / nodes * size / 40e9
        tree = 2 * math.ceil(math.log2(nodes)) * 5e-6 + 2 * size / 40e9
        assert topology.group_collective("all_reduce", size, place, hw) == pytest.approx(min(ring, tree))
        assert (tree < ring) == (algorithm == "tree")


def test_in_network_reduction_halves_the_bandwidth_term():
    ib = Link(alpha=5e-6, bandwidth=40e9)
    size, nodes = 1e9, 512
    place = topology.Placement("dp", nodes, 1, nodes)
    plain = topology.group_collective("all_reduce", size, place, gpu(ib))
    sharp = topology.group_collective("all_reduce", size, place, gpu(ib, in_network_reduction=True))
    assert sharp == pytest.approx(2 * 2 * 5e-6 + size / 40e9)  # 512 nodes: two levels of 64-port switches
    assert sharp < 0.55 * plain


def test_the_fabric_is_the_clusters_own():
    place = topology.Placement("dp", 16, 1, 16)
    one_each = topology.group_collective("all_gather", 1e9, place, gpu())
    assert topology.group_collective("all_gather", 1e9, place, gpu(nics_per_node=4)) == pytest.approx(2 * one_each)
    assert gpu(nic_gbps=400).inter.bandwidth == pytest.approx(400 / 8 * 1e9 * NIC_EFFICIENCY)
    assert NIC_EFFICIENCY * 50e9 == pytest.approx(47e9)  # the presets' measured NDR figure
    # uniform all-to-all over 16 nodes in pods of 4 at 1:7: 12 of 15 peers outside the pod, 0.8 × 7 = 5.6 × the NICs' time
    a2a = topology.Placement("ep", 16, 1, 16)
    flat = topology.group_collective("all_to_all", 1e9, a2a, gpu())
    tapered = topology.group_collective("all_to_all", 1e9, a2a, gpu(nodes_per_pod=4, oversubscription=7.0))
    assert tapered == pytest.approx(flat * 12 / 15 * 7)
    assert topology.group_collective("all_to_all", 1e9, a2a, gpu(nodes_per_pod=16, oversubscription=7.0)) == flat
    with pytest.raises(ValueError, match="oversubscription"):
        gpu(oversubscription=0.5)
