"""The simulator's formulas against hand-computed values, their limits, and clear errors for bad inputs."""

import math

import pytest
import torch

from simlib import sim
from simlib.sim import cost, grad_sync, memory
from simlib.sim.hardware import Hardware, Link, interpolate

LINK = Link(alpha=1e-5, bandwidth=1e10)  # 10 µs per step, 10 GB/s


def flat_gpu(devices_per_node=8, efficiency=0.5, peak=100e12, mem=80e9):
    """A made-up GPU with one flat GEMM efficiency, so times are easy to compute by hand."""
    return Hardware(
        "flat",
        {"bf16": peak},
        mem,
        1e12,
        LINK,
        Link(1e-4, 1e9),
        devices_per_node,
        {"bf16": [(1e-6, efficiency), (1e6, efficiency)]},
    )


# ── collectives ──
def test_ring_all_reduce_by_hand():
    # n = 4, S = 1e8 B: 2·3·1e-5 + 2·3/4·1e8/1e10 = 6e-5 + 0.015
    assert cost.ring_all_reduce(1e8, 4, LINK) == pytest.approx(6e-5 + 0.015)
    assert cost.ring_all_reduce(1e8, 1, LINK) == 0.0


def test_tree_all_gather_reduce_scatter_p2p_by_hand():
    assert cost.tree_all_reduce(1e8, 8, LINK) == pytest.approx(2 * 3 * 1e-5 + 2 * 1e8 / 1e10)
    assert cost.all_gather(1e8, 4, LINK) == pytest.approx(3e-5 + 0.75 * 0.01)
    assert cost.reduce_scatter(1e8, 4, LINK) == cost.all_gather(1e8, 4, LINK)
    assert cost.p2p(1e6, LINK) == pytest.approx(1e-5 + 1e-4)


def test_ring_all_reduce_tends_to_two_s_over_b():
    no_latency = Link(0.0, 1e10)
    times = [cost.ring_all_reduce(1e9, n, no_latency) for n in (2, 8, 64, 1024, 10**6)]
    assert all(a < b for a, b in zip(times, times[1:]))  # grows with n ...
    assert times[-1] == pytest.approx(2 * 1e9 / 1e10, rel=1e-5)  # ... towards 2·S/B


def test_hierarchical_by_hand():
    inter = Link(1e-4, 1e9)
    s, g, nodes = 8e8, 8, 4
    expected = (7 * 1e-5 + 7 / 8 * s / 1e10) * 2 + (2 * 3 * 1e-4 + 2 * 3 / 4 * (s / 8) / 1e9)
    assert cost.hierarchical_all_reduce(s, nodes, g, LINK, inter) == pytest.approx(expected)
    hw = flat_gpu()
    assert cost.all_reduce(s, 32, hw) == pytest.approx(expected)
    assert cost.all_reduce(s, 8, hw) == pytest.approx(cost.ring_all_reduce(s, 8, LINK))
    with pytest.raises(ValueError, match="whole nodes"):
        cost.all_reduce(s, 12, hw)


def test_collectives_reject_bad_inputs():
    with pytest.raises(ValueError, match=">= 0 bytes"):
        cost.ring_all_reduce(-1, 2, LINK)
    with pytest.raises(ValueError, match="int >= 1"):
        cost.ring_all_reduce(10, 0, LINK)
    with pytest.raises(ValueError, match="ring' or 'tree"):
        cost.all_reduce(10, 2, flat_gpu(), algorithm="butterfly")
    with pytest.raises(ValueError, match="alpha >= 0"):
        Link(-1.0, 1e9)


def test_fit_alpha_beta_recovers_a_ring():
    sizes = [1e3, 1e5, 1e6, 1e7, 1e8]
    times = [cost.ring_all_reduce(s, 4, LINK) for s in sizes]
    alpha, bw = sim.fit_alpha_beta(sizes, times, 4)
    assert alpha == pytest.approx(1e-5, rel=1e-6) and bw == pytest.approx(1e10, rel=1e-6)
    with pytest.raises(ValueError):
        sim.fit_alpha_beta([1e3], [1e-3], 4)


def test_published_busbw_fit_is_sane():
    a100 = sim.dgx_a100().intra
    # the fit should land between the published 1 MB and 1 GB bus bandwidths, latency in microseconds
    assert 150e9 < a100.bandwidth < 260e9 and 1e-7 < a100.alpha < 1e-4
    t_1gb = cost.ring_all_reduce(2**30, 8, a100)
    busbw = 2 * 7 / 8 * 2**30 / t_1gb
    # Azure: 228 GB/s at 1 GB; one α-β line through 1 MB..1 GB misses it by ~15 % (NCCL switches protocols)
    assert busbw == pytest.approx(228e9, rel=0.2)


# ── compute ──
def test_gemm_efficiency_table_interpolates_in_log_size():
    table = [(1, 0.6), (16, 0.9)]
    assert interpolate(table, 4) == pytest.approx(0.75)  # halfway in log2 between 1 and 16
    assert interpolate(table, 0.01) == 0.6 and interpolate(table, 1e6) == 0.9
    a100 = sim.dgx_a100()
    # Calculon's curve anchored at the measured 230 TFLOP/s of a large fp16 matmul on an A100 80GB
    assert a100.gemm_rate(128) == pytest.approx(230e12)
    assert a100.gemm_rate(0.01) < a100.gemm_rate(1) < a100.gemm_rate(100)  # small GEMMs run below peak


def test_mlp_counts_and_flops_by_hand():
    spec = sim.from_module(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
    assert spec.params == 8 * 16 + 16 + 16 * 4 + 4
    assert spec.linears == ((8, 16), (16, 4))
    assert spec.flops_per_sample() == 3 * 2 * (8 * 16 + 16 * 4)
    fwd = spec.forward_gemms(10)
    assert fwd == [(10, 8, 16, 1), (10, 16, 4, 1)]
    # first layer: grad weight only; second: grad weight and grad input
    assert cost.backward_gemms(spec, fwd) == [(8, 10, 16, 1), (16, 10, 4, 1), (10, 4, 16, 1)]
    with pytest.raises(ValueError, match="nn.Linear"):
        sim.from_module(torch.nn.ReLU())


def test_gpt_params_and_flops_match_the_published_formulas():
    g = sim.gpt(layers=24, hidden=2304, heads=24, seq_len=2048, vocab=51200)
    L, h, s, V = 24, 2304, 2048, 51200
    assert g.params == 12 * L * h * h + 13 * L * h + V * h + s * h
    # Narayanan et al. 2021: 72·B·s·L·h²·(1 + s/(6h) + V/(12hL)) per iteration, B = 1
    megatron = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert g.flops_per_sample() == pytest.approx(megatron, rel=1e-9)
    assert g.flops_per_token() == pytest.approx(6 * g.params, rel=0.2)  # ≈ 6·N plus attention
    with pytest.raises(ValueError, match="multiple of heads"):
        sim.gpt(2, 100, 3)
    with pytest.raises(ValueError, match="positive int"):
        sim.gpt(-1, 64, 4)


def test_predict_by_hand_on_a_flat_gpu():
    hw = flat_gpu(efficiency=0.5, peak=100e12)
    spec = sim.from_module(torch.nn.Linear(1000, 1000, bias=False))
    s = sim.Strategy(micro_batch=1000, num_micro_batches=2, optimizer="sgd", dtype="bf16")
    p = sim.predict(spec, hw, s)
    gemm = 2 * 1000**3 / 50e12
    assert p.compute == pytest.approx(2 * (gemm + gemm))  # forward + grad weight (no grad input), 2 micro-batches
    assert p.optimizer == pytest.approx(1e6 * 16 / 1e12)
    assert p.exposed_comm == 0 and p.bubble == 0
    assert p.step_time == pytest.approx(p.compute + p.optimizer)
    assert p.mfu == pytest.approx(3 * 2e6 * 2000 / (p.step_time * 100e12))


# ── pipeline bubble, data-parallel overlap ──
def test_pipeline_bubble_by_hand_and_in_the_limit():
    hw = flat_gpu()
    spec = sim.gpt(8, 512, 8, seq_len=128, vocab=0)
    base = sim.Strategy(pp=4, micro_batch=1)
    one = sim.predict(spec, hw, base.replace(num_micro_batches=4))
    per_mb = one.compute / 4
    assert one.bubble == pytest.approx(3 * per_mb)  # (p − 1)·(t_f + t_b)
    inter = sim.predict(spec, hw, base.replace(num_micro_batches=4, schedule="interleaved", virtual_stages=2))
    assert inter.bubble == pytest.approx(one.bubble / 2)
    fractions = [sim.predict(spec, hw, base.replace(num_micro_batches=m)) for m in (1, 4, 64, 4096)]
    fractions = [p.bubble / (p.compute + p.bubble) for p in fractions]
    assert fractions[0] == pytest.approx(3 / 4) and fractions[1] == pytest.approx(3 / 7)
    assert all(a > b for a, b in zip(fractions, fractions[1:])) and fractions[-1] < 1e-3  # → 0 as m → ∞


def test_buckets_follow_the_executors_rule():
    from simlib.models import MLP

    spec = sim.from_module(MLP(64, 2))
    s = sim.Strategy(dp=2, dtype="fp32", bucket_bytes=2**20)
    assert grad_sync.gradient_buckets(spec, s) == [4.0 * spec.params]  # 17 KB: one bucket
    small = grad_sync.gradient_buckets(spec, s.replace(bucket_bytes=64 * 64 * 4))
    assert sum(small) == 4.0 * spec.params and len(small) > 1
    assert grad_sync.bucket_sizes(10, 4) == [4.0, 4.0, 2.0]


def test_overlap_hides_communication_and_more_dp_costs_more():
    hw = flat_gpu()
    spec = sim.gpt(4, 1024, 8, seq_len=512, vocab=0)
    s = sim.Strategy(dp=8, micro_batch=2, bucket_bytes=5e6)
    off, on = sim.predict(spec, hw, s), sim.predict(spec, hw, s.replace(overlap=True))
    assert on.exposed_comm < off.exposed_comm and on.step_time < off.step_time
    comm = [sim.predict(spec, hw, s.replace(dp=n)).exposed_comm for n in (1, 2, 4, 8)]
    assert comm[0] == 0 and all(a < b for a, b in zip(comm, comm[1:]))


# ── memory ──
def test_memory_16_bytes_per_param_and_zero_stages_by_hand():
    g = sim.gpt(4, 1024, 8, seq_len=128, vocab=0)
    n = g.params
    s = sim.Strategy(dp=8, recompute="full")
    m0 = memory.memory_per_device(g, s)
    assert (m0["weights"], m0["gradients"], m0["optimizer"]) == (2 * n, 2 * n, 12 * n)
    m1 = memory.memory_per_device(g, s.replace(zero_stage=1))
    m2 = memory.memory_per_device(g, s.replace(zero_stage=2))
    m3 = memory.memory_per_device(g, s.replace(zero_stage=3))
    assert m1["optimizer"] == 12 * n / 8 and m2["gradients"] == 2 * n / 8 and m3["weights"] == 2 * n / 8
    totals = [m["total"] for m in (m0, m1, m2, m3)]
    assert all(a > b for a, b in zip(totals, totals[1:]))  # falls with every stage


def test_activation_memory_korthikanti_by_hand():
    g = sim.gpt(2, 1024, 16, seq_len=512, vocab=0)
    sbh = 512 * 1 * 1024
    full = memory.activation_bytes_per_layer(g, 1)
    assert full == pytest.approx(sbh * (34 + 5 * 16 * 512 / 1024))
    assert memory.activation_bytes_per_layer(g, 1, recompute="selective") == pytest.approx(sbh * 34)
    assert memory.activation_bytes_per_layer(g, 1, tp=4) == pytest.approx(full / 4)  # with sequence parallel
    no_sp = memory.activation_bytes_per_layer(g, 1, tp=4, sequence_parallel=False)
    assert no_sp == pytest.approx(sbh * (10 + 24 / 4 + 5 * 16 * 512 / (1024 * 4)))
    assert memory.activation_bytes_per_layer(g, 1, recompute="full") == pytest.approx(2 * sbh)
    # GPipe holds all m micro-batches, 1F1B at most pp
    s = sim.Strategy(pp=2, num_micro_batches=8)
    assert memory.in_flight_micro_batches(s) == 2
    assert memory.in_flight_micro_batches(s.replace(schedule="gpipe")) == 8


def test_a_model_that_cannot_fit_says_so():
    big = sim.gpt_size("70B")
    with pytest.raises(sim.DoesNotFit, match="GB per device"):
        sim.check_fits(big, sim.Strategy(), sim.dgx_a100())
    p = sim.predict(big, sim.dgx_a100(), sim.Strategy())
    assert not p.fits
    with pytest.raises(sim.DoesNotFit):
        sim.predict(big, sim.dgx_a100(), sim.Strategy(), require_fit=True)
    assert sim.min_devices_to_fit(big, sim.dgx_a100()) == math.ceil(big.params * 16 / (0.9 * 80 * 2**30))


# ── strategy validation ──
def test_strategy_rejects_bad_degrees_with_clear_errors():
    with pytest.raises(ValueError, match="multiply to the world size"):
        sim.Strategy(dp=3, tp=2).validate(world_size=8)
    with pytest.raises(ValueError, match="dp must be an int >= 1"):
        sim.Strategy(dp=0)
    with pytest.raises(ValueError, match="zero_stage"):
        sim.Strategy(zero_stage=4)
    with pytest.raises(ValueError, match="bucket_bytes"):
        sim.Strategy(bucket_bytes=-5)
    with pytest.raises(ValueError, match="recompute"):
        sim.Strategy(recompute="some")
    with pytest.raises(ValueError, match="multiple of pp"):
        sim.Strategy(pp=4, num_micro_batches=6, schedule="interleaved", virtual_stages=2)
    g = sim.gpt(6, 1024, 8, seq_len=128)
    with pytest.raises(ValueError, match="do not split into"):
        sim.Strategy(pp=4).validate(model=g)
    with pytest.raises(ValueError, match="attention heads"):
        sim.Strategy(tp=3).validate(model=g)
    with pytest.raises(ValueError, match="more than one node"):
        sim.Strategy(tp=16).validate(hardware=sim.dgx_h100())
    with pytest.raises(ValueError, match="unknown hardware preset"):
        sim.preset("tpu")
    assert sim.Strategy(dp=2, tp=2, pp=2, micro_batch=4, num_micro_batches=3).global_batch == 24


def test_scaling_table_speedup_and_efficiency():
    hw = flat_gpu()
    spec = sim.gpt(4, 1024, 8, seq_len=512, vocab=0)
    table = sim.scaling(spec, hw, [sim.Strategy(dp=n, micro_batch=4) for n in (1, 2, 4, 8)])
    assert table["speedup"].iloc[0] == 1.0 and table["efficiency"].iloc[0] == 1.0
    assert (table["speedup"].diff().dropna() > 0).all()
    assert (table["efficiency"] <= 1.0 + 1e-12).all()


# ── measured step overheads (calibrate() fills Hardware.overheads; presets have none) ──


def test_fit_p2p_recovers_alpha_and_bandwidth():
    from simlib.sim.hardware import fit_p2p

    sizes = [16e3, 256e3, 1e6]
    alpha, bw = fit_p2p(sizes, [1e-4 + s / 1e9 for s in sizes])
    assert alpha == pytest.approx(1e-4, rel=1e-6) and bw == pytest.approx(1e9, rel=1e-6)


def test_presets_have_no_overhead_terms():
    hw = flat_gpu()
    assert hw.straggler(4) == 1.0 and hw.comm_in_situ(4) == 1.0 and hw.layer_factor(4) == 1.0
    assert hw.accumulate_grad_rate(4) is None and hw.p2p_link() is None


def test_accumulate_grad_by_hand():
    hw = flat_gpu().with_(overheads={"accumulate_grad_Bps": {1: 1e9}})
    s = sim.Strategy(dtype="fp32")
    # .grad += new: read 4 + read 4 + write 4 bytes per fp32 parameter, 1e6 parameters at 1 GB/s
    assert cost.accumulate_grad_time(1e6, hw, s) == pytest.approx(12e6 / 1e9)
    assert cost.accumulate_grad_time(1e6, hw, sim.Strategy(dtype="bf16")) == pytest.approx(6e6 / 1e9)


def test_layer_and_straggler_factors_scale_stage_times_by_hand():
    spec = sim.from_module(torch.nn.Linear(1000, 1000, bias=False))
    s = sim.Strategy(micro_batch=1000, dtype="bf16")
    base = flat_gpu(efficiency=0.5, peak=100e12)
    gemm = 2 * 1000**3 / 50e12
    assert cost.stage_times(spec, base, s, processes=2) == pytest.approx((gemm, gemm))
    hw = base.with_(overheads={"layer_factor": {2: 1.25}, "straggler": {2: 1.1}})
    t_f, t_b = cost.stage_times(spec, hw, s, processes=2)
    assert t_f == pytest.approx(1.1 * 1.25 * gemm) and t_b == pytest.approx(1.1 * 1.25 * gemm)
    # one process: no straggler, but the layer factor still applies
    assert cost.stage_times(
        spec, hw.with_(overheads={"layer_factor": {1: 1.25}, "straggler": {2: 1.1}}), s, processes=1
    )[0] == pytest.approx(1.25 * gemm)


def test_comm_in_situ_scales_the_all_reduce_not_the_packing():
    spec = sim.from_module(torch.nn.Linear(1000, 1000, bias=False))  # 1e6 params, 2 MB of bf16 gradients
    s = sim.Strategy(dp=4, micro_batch=8, dtype="bf16")
    hw = flat_gpu(mem=80e9)
    plain = grad_sync.bucket_comm_times(spec, hw, s, processes=4)
    ring = cost.ring_all_reduce(2e6, 4, LINK)
    pack = 6 * 2e6 / 1e12
    assert plain == pytest.approx([ring + pack])
    hot = grad_sync.bucket_comm_times(spec, hw.with_(overheads={"comm_in_situ": {4: 2.0}}), s, processes=4)
    assert hot == pytest.approx([2 * ring + pack])


def test_sync_factors_by_hand():
    from simlib.sim.calibrate import sync_factors

    # two ranks, two cycles of (burst s, all-reduce s); the back-to-back all-reduce took 0.02 s (slowest rank)
    r0 = {"cycles": [(0.10, 0.05), (0.10, 0.06)], "comm": [(1 << 20, 0.01), (16 << 20, 0.02)]}
    r1 = {"cycles": [(0.12, 0.04), (0.14, 0.03)], "comm": [(1 << 20, 0.01), (16 << 20, 0.015)]}
    straggler, insitu = sync_factors([r0, r1, None])
    # straggler: median(0.12 / 0.11, 0.14 / 0.12); in situ: median(0.16 − 0.12, 0.17 − 0.14) / 0.02
    assert straggler == pytest.approx((0.12 / 0.11 + 0.14 / 0.12) / 2)
    assert insitu == pytest.approx((0.04 + 0.03) / 2 / 0.02)
    assert sync_factors([{"cycles": []}, None]) is None


def test_gemm_time_uses_an_exactly_measured_shape():
    table = {(1, 1): [(1e-6, 50e9), (1e3, 50e9)]}  # 50 GFLOP/s for every size
    hw = Hardware(
        "cpu",
        {},
        8e9,
        10e9,
        LINK,
        LINK,
        1,
        table,
        cores=1,
        overheads={"gemm_shapes": {(1, 1): {(1024, 64, 1024): 25e9}}},
    )
    flops = 2 * 1024 * 64 * 1024
    assert cost.gemm_time(1024, 64, 1024, hw, processes=1) == pytest.approx(flops / 25e9)  # measured shape
    assert cost.gemm_time(64, 1024, 1024, hw, processes=1) == pytest.approx(flops / 50e9)  # table by GFLOPs
