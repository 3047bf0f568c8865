"""The cluster terms of the simulator: operators of a layer, groups on the rank grid, the nccl-tests curve,
recomputation, interleaving, ZeRO-3, validation against the hardware — by hand, by monotonicity, and against
the published Megatron-LM runs (Narayanan et al. 2021, Table 1)."""

import pytest

from simlib import sim
from simlib.sim import cost, grad_sync, layer, layer_strategy, memory, topology
from simlib.sim.hardware import Hardware, Link
from simlib.sim.published import NARAYANAN_2021_TABLE_1, published_table

NVLINK = Link(alpha=0.0, bandwidth=100e9)  # made-up links: round numbers for hand computation
IB = Link(alpha=0.0, bandwidth=10e9)


def gpu(mem_efficiency=None, processing="roofline", efficiency=0.5):
    """A made-up GPU: 100 TFLOP/s peak at a flat GEMM efficiency, 1 TB/s memory, 8 per node."""
    return Hardware(
        "toy",
        {"bf16": 100e12, "fp16": 100e12},
        80e9,
        1e12,
        NVLINK,
        IB,
        8,
        {"bf16": [(1e-6, efficiency), (1e6, efficiency)]},
        mem_efficiency=mem_efficiency,
        processing=processing,
    )


TINY = sim.gpt(layers=4, hidden=64, heads=4, seq_len=16, vocab=0)


# ── operators of a layer ──
def test_layer_operators_by_hand():
    ops = layer.layer_ops(TINY, micro_batch=2, tp=1)
    fwd = {op.name: op for op in ops["forward"]}
    t, h, s, b, a = 32, 64, 16, 2, 4
    assert fwd["layer norm 1"].bytes == 2 * 2 * t * h  # read + write, 2 bytes each
    assert fwd["QKV"].shape == (t, h, 3 * h) and fwd["QKV"].flops == 2 * t * h * 3 * h
    assert fwd["QKV"].bytes == 2 * (t * h + h * 3 * h + t * 3 * h)  # both inputs and the output
    assert fwd["scores Q·Kᵀ"].count == b * a and fwd["scores Q·Kᵀ"].shape == (s, h // a, s)
    assert fwd["scale+mask+softmax (fused)"].bytes == 2 * 2 * b * a * s * s
    assert fwd["attention dropout"].bytes == 5 * b * a * s * s  # read, write, 1-byte mask
    assert fwd["bias+dropout+add (fused)"].bytes == 7 * t * h
    assert fwd["bias+GeLU (fused)"].bytes == 2 * 2 * 4 * t * h
    gemm_flops = sum(op.flops for op in ops["forward"])
    assert gemm_flops == TINY.forward_flops(2) / TINY.layers  # the same GEMMs as the FLOP count
    assert sum(op.flops for op in ops["backward"]) == pytest.approx(2 * gemm_flops)  # dgrad + wgrad
    assert not [op for op in ops["forward"] + ops["backward"] if op.kind == "comm"]  # tp = 1: no collectives


def test_gemm_roofline_and_no_overlap_by_hand():
    op = layer.Op("g", "gemm", 4e9, (1000, 1000, 1000), 1)  # 2 GFLOP, 4 GB moved
    math_s, mem_s = 2e9 / 50e12, 4e9 / 1e12
    assert layer.op_time(op, gpu()) == pytest.approx(max(math_s, mem_s))
    assert layer.op_time(op, gpu(processing="no_overlap")) == pytest.approx(math_s + mem_s)
    kernel = layer.Op("k", "memory", 5e6)
    assert layer.op_time(kernel, gpu()) == pytest.approx(5e6 / 1e12)
    # Calculon-style achievable bandwidth: 5 MB lies halfway (in log) between 1 MB (60 %) and 25 MB (90 %)
    hw = gpu(mem_efficiency=[(1, 0.6), (25, 0.9)])
    assert hw.achievable_bandwidth(5e6) == pytest.approx(1e12 * 0.75)
    assert layer.op_time(kernel, hw) == pytest.approx(5e6 / 0.75e12)
    with pytest.raises(ValueError, match="roofline"):
        gpu(processing="overlap")


def test_operator_table_adds_up_to_the_stage_time():
    s = sim.Strategy(tp=2, micro_batch=2, recompute="full")
    hw = gpu()
    table = sim.operator_table(TINY, hw, s)
    assert set(table.phase) == {"forward", "recompute", "backward"}
    st = cost.gpt_stage(TINY, hw, s)
    per_layer = st["forward"] + st["backward"] + st["forward_comm"] + st["backward_comm"]
    lookup = layer.embedding_ops(TINY, 2, 2)  # pp = 1: the one stage has it
    ends = layer.ops_time(lookup["forward"] + lookup["backward"], hw, s)
    assert table.ms.sum() / 1e3 * TINY.layers + ends == pytest.approx(per_layer)


def test_tensor_parallel_collectives_and_recomputation_by_hand():
    ops = layer.layer_ops(TINY, micro_batch=2, tp=2)
    comm = lambda items: [op.collective for op in items if op.kind == "comm"]
    assert comm(ops["forward"]) == ["all_reduce"] * 2 and comm(ops["backward"]) == ["all_reduce"] * 2
    assert all(op.bytes == 2 * 32 * 64 for op in ops["forward"] if op.kind == "comm")  # b·s·h, 2 bytes
    # full recomputation re-runs the forward, its two all-reduces included; selective only attention's core
    assert comm(layer_strategy.recompute_ops(ops["forward"], "full")) == ["all_reduce"] * 2
    selective = layer_strategy.recompute_ops(ops["forward"], "selective")
    assert not comm(selective) and {op.kind for op in selective} == {"gemm", "memory"}
    assert layer_strategy.recompute_ops(ops["forward"], "none") == []
    # sequence parallelism: all-gather / reduce-scatter pairs, in forward and again in backward
    sp = layer.layer_ops(TINY, micro_batch=2, tp=2, sequence_parallel=True)
    assert comm(sp["forward"]) == ["all_gather", "reduce_scatter"] * 2
    # backward: g's all-gather, the input all-gathered again for the weight gradient, f's reduce-scatter
    assert sorted(comm(sp["backward"])) == ["all_gather"] * 4 + ["reduce_scatter"] * 2
    assert sp["forward"][0].bytes == ops["forward"][0].bytes / 2  # layer norm on s/tp of the sequence


# ── links: the published curve ──
def test_busbw_curve_reproduces_published_points_and_its_ends():
    a100 = sim.dgx_a100().intra
    for size, busbw in sim.hardware_presets.AZURE_A100_80GB_ALLREDUCE:
        t = cost.ring_all_reduce(size, 8, a100)
        assert 2 * 7 / 8 * size / t == pytest.approx(busbw * 1e9)  # exact at every published point
    t_1mb = cost.ring_all_reduce(1 << 20, 8, a100)
    assert cost.ring_all_reduce(1 << 10, 8, a100) == pytest.approx(t_1mb)  # below: latency-bound, same time
    t_4gb = cost.ring_all_reduce(4 << 30, 8, a100)
    assert 2 * 7 / 8 * (4 << 30) / t_4gb == pytest.approx(228e9)  # above: flat at the last point


# ── groups on the rank grid ──
def test_placement_follows_the_rank_grid():
    hw = gpu()
    p = topology.placement(sim.Strategy(dp=9, tp=8), hw, "dp")  # replicas 8 ranks apart
    assert (p.per_node, p.nodes) == (1, 9)
    p = topology.placement(sim.Strategy(dp=32), hw, "dp")
    assert (p.per_node, p.nodes) == (8, 4)
    p = topology.placement(sim.Strategy(dp=4, tp=2), hw, "dp")
    assert p.intra_node and p.size == 4
    p = topology.placement(sim.Strategy(dp=8, tp=2, pp=2), hw, "dp")  # stride 4: 2 per node, 4 nodes
    assert (p.per_node, p.nodes) == (2, 4)
    assert topology.placement(sim.Strategy(tp=8, dp=2), hw, "tp").intra_node
    assert topology.group_ranks(sim.Strategy(dp=2, pp=2, tp=2), "pp") == [0, 2]
    with pytest.raises(ValueError, match="group kind"):
        topology.group_ranks(sim.Strategy(), "xp")
    # view(dp, pp, cp, tp): cp ranks tp apart, pp stride tp·cp; ep takes consecutive dp × cp ranks (cp first)
    s = sim.Strategy(dp=4, pp=2, cp=2, tp=2, ep=4)
    assert topology.group_ranks(s, "cp") == [0, 2] and topology.group_ranks(s, "pp") == [0, 4]
    assert topology.group_ranks(s, "dp") == [0, 8, 16, 24]
    assert topology.group_ranks(s, "ep") == [0, 2, 8, 10]
    assert topology.group_ranks(s, "expert_dp") == [0, 16]


def test_group_collectives_by_hand():
    hw, S = gpu(), 8e9
    ring_ib = 2 * 8 / 9 * S / 10e9  # dp=9, one per node: ring on IB
    place = topology.placement(sim.Strategy(dp=9, tp=8), hw, "dp")
    assert topology.group_collective("all_reduce", S, place, hw) == pytest.approx(ring_ib)
    # dp = 32 on 4 nodes: reduce-scatter in node, all-reduce S/8 between 4 nodes, all-gather in node
    place = topology.placement(sim.Strategy(dp=32), hw, "dp")
    inside = 7 / 8 * S / 100e9
    between = 2 * 3 / 4 * (S / 8) / 10e9
    assert topology.group_collective("all_reduce", S, place, hw) == pytest.approx(2 * inside + between)
    assert topology.group_collective("all_gather", S, place, hw) == pytest.approx(inside + between / 2)
    one = topology.Placement("tp", 1, 1, 1)
    assert topology.group_collective("all_reduce", S, one, hw) == 0.0
    with pytest.raises(ValueError, match="collective must be"):
        topology.group_collective("broadcast", S, place, hw)


def test_zero3_costs_one_and_a_half_times_ddp():
    model, hw = sim.gpt(96, 12288, 96, vocab=51200), sim.dgx_a100()
    s = sim.Strategy(dp=64, micro_batch=1, bucket_bytes=1e12)  # one bucket: no packing subtleties
    ddp = grad_sync.dp_comm_time(model, hw, s)[0]
    zero3 = grad_sync.dp_comm_time(model, hw, s.replace(zero_stage=3))[0]
    pack = 6 * grad_sync.grad_bytes(model, s) / hw.mem_rate()
    assert (zero3 - pack) / (ddp - pack) == pytest.approx(1.5, rel=1e-6)  # Rajbhandari et al. 2020 §7


def test_pipeline_messages_cross_nvlink_only_when_stages_share_a_node():
    hw, act = gpu(), 1e9
    inside = sim.Strategy(tp=2, pp=4)  # 8 ranks: one node
    assert topology.same_node(inside, hw)
    assert topology.p2p_time(act, inside, hw) == pytest.approx(act / 2 / 100e9 + 1 / 2 * act / 100e9)
    across = sim.Strategy(tp=8, pp=2, dp=3)  # each stage its own node
    assert not topology.same_node(across, hw)
    # scatter/gather: each of 8 ranks sends 1/8 over its NIC, then an all-gather over NVLink
    assert topology.p2p_time(act, across, hw) == pytest.approx(act / 8 / 10e9 + 7 / 8 * act / 100e9)
    assert not topology.same_node(sim.Strategy(tp=4, pp=4), hw)  # 16 ranks: the boundary 1|2 crosses
    big = sim.Strategy(dp=16, tp=2, pp=4, micro_batch=1, num_micro_batches=8)
    p = sim.predict(sim.gpt(8, 512, 8, seq_len=128, vocab=0), hw, big)
    assert p.breakdown["pp_comm"] == pytest.approx(
        16 * topology.p2p_time(1 * 128 * 512 * 2, big, hw)
    )  # 2·m·v messages, NVLink


# ── recomputation, interleaving: time and memory ──
def test_more_recomputation_is_never_faster_and_needs_less_memory():
    hw, model = sim.dgx_a100(), sim.gpt_size("7B")
    base = sim.Strategy(dp=8, tp=8, pp=1, micro_batch=2, num_micro_batches=4)
    preds = [sim.predict(model, hw, base.replace(recompute=r)) for r in ("none", "selective", "full")]
    steps = [p.step_time for p in preds]
    assert steps[0] < steps[1] < steps[2]
    acts = [p.memory["activations"] for p in preds]
    assert acts[0] > acts[1] > acts[2]
    assert preds[2].breakdown["tp_comm"] == pytest.approx(1.5 * preds[0].breakdown["tp_comm"])  # 6 vs 4 per layer


def test_more_interleaving_means_more_messages_smaller_bubble_more_memory():
    hw, model = sim.dgx_a100(), sim.gpt(48, 4096, 32, vocab=51200)
    base = sim.Strategy(dp=2, tp=8, pp=4, micro_batch=1, num_micro_batches=8, recompute="full")
    preds = [
        sim.predict(model, hw, base.replace(schedule="interleaved", virtual_stages=v) if v > 1 else base)
        for v in (1, 2, 3, 4)
    ]
    messages = [p.breakdown["pp_messages"] for p in preds]
    assert messages == [2 * 8 * v for v in (1, 2, 3, 4)]  # never fewer: 2·m·v
    assert all(a > b for a, b in zip([p.bubble for p in preds], [p.bubble for p in preds][1:]))
    assert all(
        a < b for a, b in zip([p.breakdown["pp_comm"] for p in preds], [p.breakdown["pp_comm"] for p in preds][1:])
    )
    s2 = base.replace(schedule="interleaved", virtual_stages=2)
    assert memory.interleave_factor(s2) == pytest.approx(1 + 3 / 8)  # 1 + (p − 1)/(p·v)
    assert memory.interleave_factor(base) == 1.0
    acts = [p.memory["activations"] for p in preds]
    assert acts[0] < acts[1]  # first stage holds more


# ── validation against the hardware ──
def test_tensor_parallelism_stays_in_a_node_unless_asked():
    hw, model = sim.dgx_a100(), sim.gpt_size("70B")
    with pytest.raises(ValueError, match="spans more than one node"):
        sim.predict(model, hw, sim.Strategy(tp=16))
    with pytest.raises(ValueError, match="straddle two nodes"):
        sim.Strategy(tp=3).validate(hardware=hw)
    across = sim.predict(model, hw, sim.Strategy(tp=16, pp=4, tp_across_nodes=True, recompute="full"))
    inside = sim.predict(model, hw, sim.Strategy(tp=8, pp=8, recompute="full"))
    assert across.breakdown["tp_comm"] > 2 * inside.breakdown["tp_comm"]  # hierarchical, over InfiniBand
    placed = topology.placement(sim.Strategy(tp=16, tp_across_nodes=True), hw, "tp")
    assert (placed.per_node, placed.nodes) == (8, 2)


def test_a_plan_that_does_not_fit_reports_no_throughput():
    from simlib import widgets

    hw, model = sim.dgx_a100(), sim.gpt_size("70B")
    p = sim.predict(model, hw, sim.Strategy(dp=8))
    assert not p.fits and p.throughput is None and p.tokens_per_s is None and p.mfu is None
    assert p.step_time > 0  # the time is still shown
    text = widgets.explain(model, hw, sim.Strategy(dp=8))
    assert "does NOT fit" in text and "tokens/s" not in text
    assert "spans more than one node" in widgets.explain(model, hw, sim.Strategy(tp=16))


def test_data_parallel_sizes_that_are_not_whole_nodes_are_expressible():
    hw, model = sim.dgx_a100(), sim.gpt(48, 8192, 64, vocab=51200)
    p = sim.predict(model, hw, sim.Strategy(dp=9, tp=8, pp=2, micro_batch=1, num_micro_batches=16, recompute="full"))
    assert p.fits and p.breakdown["dp_comm"] > 0


# ── the published runs ──
def test_every_published_row_is_expressible_and_within_target():
    table = published_table()
    assert len(table) == len(NARAYANAN_2021_TABLE_1) == 10
    assert table.fits.all() and table.predicted_tflops.notna().all()
    for run, params in zip(NARAYANAN_2021_TABLE_1, table.params_b_formula):
        assert params == pytest.approx(run.params_b, rel=0.05)  # our parameter formula, the paper's count
        assert run.dp * run.micro_batch * run.num_micro_batches == run.global_batch
    mae = table.error.abs().mean()
    assert mae <= 0.10, f"mean |error| {mae:.1%} against Narayanan et al. 2021 Table 1"
    assert table.error.notna().all()  # every row has a number


def test_the_explorer_refuses_impossible_plans():
    from simlib import widgets

    hw, model = sim.dgx_a100(), sim.gpt_size("7B")
    text, p = widgets.explorer_view(model, hw, sim.Strategy(dp=2, tp=16))
    assert p is None and "not a valid configuration" in text and "node" in text
    text, p = widgets.explorer_view(sim.gpt_size("1.3B"), hw, sim.Strategy(pp=16))  # 24 layers over 16
    assert p is None and "do not split" in text
    text, p = widgets.explorer_view(model, hw, sim.Strategy(dp=8, micro_batch=1, num_micro_batches=8, zero_stage=1))
    assert p is not None and p.fits and " on 8 x " in text and "tokens/s" in text
    box = widgets.simulator_explorer()  # builds and draws once
    grid, html, out = box.children
    controls = {c.description: c for c in grid.children}
    controls["tp"].value = 16  # beyond a node
    assert "not a valid configuration" in html.value and out.outputs == ()


def test_selective_recomputation_and_the_embedding_sync_by_hand():
    hw = gpu()
    s = sim.Strategy(tp=2, micro_batch=2)
    core = [
        op
        for op in layer.layer_ops(TINY, 2, 2)["forward"]
        if op.name.startswith(("scores", "scale+mask", "attention dropout", "context P"))
    ]
    selective = cost.gpt_stage(TINY, hw, s.replace(recompute="selective"))["backward"]
    extra = selective - cost.gpt_stage(TINY, hw, s)["backward"]
    assert extra == pytest.approx(TINY.layers * layer.ops_time(core, hw, s))
    # tied embeddings: first and last stage all-reduce V/tp × h gradients once per step (2 ranks)
    model = sim.gpt(4, 64, 4, seq_len=16, vocab=1024)
    across = sim.Strategy(tp=8, pp=2)  # stages on two nodes: InfiniBand
    size = 1024 / 8 * 64 * 2
    assert grad_sync.embedding_sync_time(model, hw, across) == pytest.approx(2 * 1 / 2 * size / 10e9)
    size_tp2 = 1024 / 2 * 64 * 2  # one node: NVLink
    assert grad_sync.embedding_sync_time(model, hw, sim.Strategy(tp=2, pp=2)) == pytest.approx(size_tp2 / 100e9)
    assert grad_sync.embedding_sync_time(model, hw, sim.Strategy(tp=2)) == 0.0


def test_an_independent_set_of_published_runs_is_predicted_too():
    from simlib.sim.published import KORTHIKANTI_2022, korthikanti_table

    table = korthikanti_table()
    assert len(table) == len(KORTHIKANTI_2022) == 8 and table.fits.all()
    full, seqsel = table[table["mode"] == "full"], table[table["mode"] == "seqsel"]
    assert (seqsel.predicted_s.to_numpy() < full.predicted_s.to_numpy()).all()  # as published: SP + selective wins
    assert table.error.abs().mean() <= 0.10


def test_recomputation_working_set_and_logits_memory_by_hand():
    g = sim.gpt(4, 64, 4, seq_len=16, vocab=1024)
    s, b, h = 16, 2, 64
    st = sim.Strategy(micro_batch=b, recompute="full")
    full_layer = s * b * h * (34 + 5 * 4 * s / h)  # Korthikanti et al.: one whole layer
    logits = 4 * b * s * 1024  # fp32 logits, pp = 1
    expected = 2 * s * b * h * 4 + full_layer + logits  # inputs of 4 layers + working set
    assert memory.memory_per_device(g, st)["activations"] == pytest.approx(expected)
    none = memory.memory_per_device(g, st.replace(recompute="none"))["activations"]
    assert none == pytest.approx(full_layer * 4 + logits)
