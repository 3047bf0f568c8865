"""The simulator at cluster scale: context parallelism, mixtures of experts, uneven stages, partial recompute, the
mapping from a trainer's Plan. Formulas checked by hand, and lesson 09's pricing (context_experts) as the
small-scale check of the same collectives."""

import pytest

from simlib import sim
from simlib.parallel.experts import a2a_volume
from simlib.sim import context_experts, topology
from simlib.sim.cluster_ops import cp_ops, moe_ops
from simlib.sim.cost import gpt_stage


def llama8b(seq=8192):
    return sim.llama_size("llama3-8b", seq_len=seq)


# ── models ──
def test_moe_models_count_total_and_active_parameters():
    m = sim.llama_size("mixtral-8x7b")
    assert m.params == pytest.approx(46.7e9, rel=0.01)  # Mixtral's model card: 46.7B total
    dense_mlp = 3 * 4096 * 14336
    active = m.params - m.layers * 6 * dense_mlp  # 2 of 8 experts per token
    # model FLOPs count the active experts only (+ router and attention)
    assert 6 * active < m.flops_per_token() < 6 * active * 1.2
    d = sim.llama_size("deepseek-moe-16b")
    assert d.params == pytest.approx(16.4e9, rel=0.02)  # DeepSeekMoE 16B
    assert d.moe_layers == 27 and d.expert_width == 1408
    with pytest.raises(ValueError, match="top_k"):
        sim.transformer(2, 64, 4, experts=4, top_k=5)


# ── strategy checks ──
def test_cp_and_ep_are_validated():
    s = sim.Strategy(dp=2, cp=4, tp=2, ep=8)
    assert s.world_size == 16 and s.expert_dp == 1
    with pytest.raises(ValueError, match="divide the dp x cp"):
        sim.Strategy(dp=2, cp=2, ep=8)
    with pytest.raises(ValueError, match="cp_kind"):
        sim.Strategy(cp=2, cp_kind="tree")
    with pytest.raises(ValueError, match="is dense"):
        sim.Strategy(dp=2, ep=2).validate(model=llama8b())
    with pytest.raises(ValueError, match="Ulysses"):
        sim.Strategy(cp=16, tp=8, cp_kind="ulysses").validate(model=llama8b())
    with pytest.raises(ValueError, match="zig-zag"):
        sim.Strategy(cp=3).validate(model=llama8b(4096))
    with pytest.raises(ValueError, match="experts do not split"):
        sim.Strategy(dp=16, ep=16).validate(model=sim.llama_size("mixtral-8x7b"))
    with pytest.raises(ValueError, match="recompute='full'"):
        sim.Strategy(recompute_layers=2)


# ── context parallelism ──
def test_cp_splits_every_gemm_and_the_attention_by_cp():
    m, hw = llama8b(32768), sim.dgx_h100()
    base = sim.Strategy(attention="flash", micro_batch=1)
    one = sim.layer_strategy.strategy_layer_ops(m, base)
    four = sim.layer_strategy.strategy_layer_ops(m, base.replace(cp=4))
    flops = lambda ops: sum(op.flops for op in ops["forward"] + ops["backward"])  # noqa: E731
    assert flops(four) == pytest.approx(flops(one) / 4)
    assert [op.collective for op in four["forward"] if op.kind == "comm"] == ["all_gather"]
    st1, st4 = gpt_stage(m, hw, base), gpt_stage(m, hw, base.replace(cp=4))
    assert st1["forward"] / 4 * 0.999 < st4["forward"] < st1["forward"] / 3  # small GEMMs: never faster


def test_cp_collectives_by_hand_and_as_lesson_09_prices_them():
    m, hw = llama8b(8192), sim.dgx_h100()
    b, cp, w = 1, 4, 2
    kv_full = w * 2 * b * 8192 * m.kv * m.head_dim
    ag = cp_ops(m, b, 1, cp, "allgather", w)
    assert ag["forward"][0].bytes == kv_full and len(ag["backward"]) == 2
    ring = cp_ops(m, b, 1, cp, "ring", w)["forward"][0]
    assert ring.count == cp - 1 and ring.bytes == pytest.approx((cp - 1) * kv_full / cp)
    s = sim.Strategy(cp=cp, cp_kind="ring")
    place = topology.placement(s, hw, "cp")
    hop = topology.group_collective("p2p", kv_full / cp, place, hw)
    assert hop == pytest.approx(context_experts._p2p(kv_full / cp, hw))  # lesson 09's hop on a preset
    uly = cp_ops(m, b, 1, cp, "ulysses", w)
    q = w * b * 8192 // cp * m.hidden
    assert [op.bytes for op in uly["forward"]][0] == q
    a2a = topology.group_collective("all_to_all", q, place, hw)
    assert a2a == pytest.approx(context_experts.all_to_all_time(q, cp, hw))  # lesson 09's all-to-all


def test_ring_hops_hide_behind_attention_the_all_gather_does_not():
    m, hw = llama8b(65536), sim.dgx_h100()
    s = sim.Strategy(cp=8, attention="flash", micro_batch=1, cp_kind="ring")
    ring = gpt_stage(m, hw, s)
    gathered = gpt_stage(m, hw, s.replace(cp_kind="allgather"))
    assert ring["cp_comm"] == 0.0 < gathered["cp_comm"]  # a long sequence: each hop shorter than its block
    short = gpt_stage(sim.llama_size("llama3-8b", seq_len=2048), hw, s.replace(micro_batch=1))
    assert short["cp_comm"] > 0  # short blocks: the hops stick out


# ── experts ──
def test_moe_dispatch_matches_lesson_09s_volume_and_grows_across_nodes():
    m = sim.llama_size("mixtral-8x7b")
    tokens, ep = 4096, 8
    ops = moe_ops(m, tokens, 1, ep, 2)
    dispatch = next(op for op in ops["forward"] if op.name == "dispatch all-to-all")
    vol = a2a_volume(tokens, m.hidden, m.top_k, ep, 2)
    # lesson 09 counts what leaves the rank ((ep-1)/ep of it); the op holds the rank's whole buffer
    assert dispatch.bytes * (ep - 1) / ep == pytest.approx(vol["dispatch"])
    assert sum(op.kind == "comm" for op in ops["forward"] + ops["backward"]) == 4
    hw = sim.dgx_h100()
    inside = topology.group_collective("all_to_all", dispatch.bytes, topology.Placement("ep", 8, 8, 1), hw)
    across = topology.group_collective("all_to_all", dispatch.bytes, topology.Placement("ep", 16, 8, 2), hw)
    assert across > 2 * inside  # half the buffer over a NIC, 8x slower than NVLink
    # an expert-parallel rank runs tokens × top_k rows through its experts, times the imbalance
    up = next(op for op in ops["forward"] if op.name.startswith("experts up"))
    assert up.count == 1 and up.shape[0] == tokens * 2
    skew = moe_ops(m, tokens, 1, ep, 2, imbalance=1.5)
    assert next(op for op in skew["forward"] if op.name.startswith("experts up")).shape[0] == tokens * 3


def test_moe_memory_splits_experts_over_ep():
    m, s = sim.llama_size("mixtral-8x7b"), sim.Strategy(dp=8, micro_batch=1, attention="flash")
    one, eight = sim.memory_per_device(m, s), sim.memory_per_device(m, s.replace(ep=8))
    expert_bytes = m.expert_params * 2
    assert one["weights"] - eight["weights"] == pytest.approx(expert_bytes * 7 / 8)
    zero = sim.memory_per_device(m, s.replace(ep=8, zero_stage=1))
    dense = (m.params - m.expert_params) * 12
    assert zero["optimizer"] == pytest.approx(dense / 8 + m.expert_params / 8 * 12)  # experts' states not split


def test_moe_step_slower_across_nodes_and_with_imbalance():
    m, hw = sim.llama_size("mixtral-8x7b", seq_len=4096), sim.dgx_h100()
    s = sim.Strategy(
        dp=16, pp=4, ep=8, micro_batch=1, num_micro_batches=16, attention="flash", recompute="full", zero_stage=1
    )
    p = sim.predict(m, hw, s)
    assert p.breakdown["ep_comm"] > 0
    skew = sim.predict(m, hw, s.replace(expert_imbalance=1.3))
    assert skew.step_time > p.step_time


# ── pipelines and recomputation ──
def test_uneven_stages_and_partial_recompute():
    s = sim.Strategy(pp=16, first_stage_layers=7, last_stage_layers=7)
    assert s.stage_layers(126) == [7] + [8] * 14 + [7]  # Llama 3 405B's layout
    with pytest.raises(ValueError, match="do not split"):
        s.stage_layers(127)
    m, hw = sim.llama_size("llama3-70b"), sim.dgx_h100()
    even = sim.Strategy(tp=8, pp=4, micro_batch=1, num_micro_batches=8, attention="flash", sequence_parallel=True)
    uneven = even.replace(first_stage_layers=18, last_stage_layers=18)  # 18 + 22 + 22 + 18
    assert gpt_stage(m, hw, uneven)["forward"] > gpt_stage(m, hw, even)["forward"]  # a middle stage is longer
    full = even.replace(recompute="full")
    part = full.replace(recompute_layers=5)
    t = [gpt_stage(m, hw, x)["backward"] for x in (even, part, full)]
    assert t[0] < t[1] < t[2]
    mem = [sim.memory_per_device(m, x)["activations"] for x in (even, part, full)]
    assert mem[0] > mem[1] > mem[2]


def test_pipeline_flushes_pay_a_bubble_each():
    m, hw = sim.llama_size("llama3-8b"), sim.dgx_h100()
    s = sim.Strategy(pp=4, micro_batch=1, num_micro_batches=8, attention="flash")
    one, two = sim.predict(m, hw, s), sim.predict(m, hw, s.replace(pipeline_flushes=2))
    assert two.bubble == pytest.approx(2 * one.bubble)
    assert two.compute == pytest.approx(one.compute)


# ── one mapping from a Plan ──
def test_dry_run_and_from_plan_are_one_mapping_and_price_pipelines_cp_and_ep():
    from simlib.dry_run import sim_model, strategy_for
    from simlib.projects.gpt.task import GPTTask
    from simlib.train import OptimConfig, Plan

    task = GPTTask.quick(moe_experts=4, moe_top_k=2)
    optim = OptimConfig()
    pipe = Plan(pp=2, pp_microbatches=4, accumulation=2)
    s = strategy_for(pipe, task, optim)
    # before: the dry run priced this as one micro-batch of 8 samples per pass; now 8 micro-batches of 2, 2 flushes
    assert s == sim.Strategy.from_plan(pipe, task.global_batch, optimizer=s.optimizer)
    assert (s.micro_batch, s.num_micro_batches, s.pipeline_flushes) == (2, 8, 2)
    model = sim_model(task)
    assert model.experts == 4 and model.top_k == 2
    both = Plan(dp=2, cp=2, ep=4)
    s = strategy_for(both, task, optim)
    assert (s.dp, s.cp, s.ep, s.cp_kind, s.world_size) == (2, 2, 4, "ring", 4)
    p = sim.predict(model, sim.preset("h100"), s)
    assert p.step_time > 0 and p.breakdown["ep_comm"] > 0 and p.breakdown["cp_comm"] >= 0


# ── Blackwell presets and FP8 ──
def test_blackwell_presets_and_fp8_gemms():
    b200, nvl72, b300 = sim.preset("b200"), sim.preset("gb200"), sim.preset("b300")
    assert b200.peak("fp8") == 2 * b200.peak("bf16") and b200.peak("fp4") == 2 * b200.peak("fp8")
    assert nvl72.devices_per_node == 72 and b300.memory_bytes > nvl72.memory_bytes > b200.memory_bytes
    # a B200 reaches ~1.5 PFLOP/s on a large bf16 GEMM (measured), an H100 ~0.78
    assert 1.4e15 < b200.gemm_rate(1000, "bf16") < 1.55e15 and sim.dgx_h100().gemm_rate(1000, "bf16") < 0.8e15
    h100 = sim.dgx_h100()
    assert h100.gemm_rate(1000, "fp8") / h100.gemm_rate(1000, "bf16") == pytest.approx(1414 / 780)
    # tp = 24 fits inside an NVL72 domain, not inside a DGX
    sim.Strategy(tp=24, dp=3).validate(hardware=nvl72)
    with pytest.raises(ValueError, match="spans more than one node"):
        sim.Strategy(tp=24, dp=3).validate(hardware=b200)
    # FP8: attention GEMMs stay 16-bit; current scaling costs more casts than delayed
    m = sim.llama_size("llama3-8b")
    s = sim.Strategy(dtype="fp8", micro_batch=1, attention="unfused")
    table = sim.operator_table(m, h100, s)
    scores = table[table.op == "scores Q·Kᵀ"].iloc[0]
    assert scores.tflops < 0.8 * h100.peak("bf16") / 1e12
    delayed, current = (
        gpt_stage(m, h100, s.replace(fp8_recipe=r, attention="flash"))["forward"] for r in ("delayed", "current")
    )
    assert current > delayed


# ── the cluster-scale validation set ──
def test_scale_runs_are_stated_with_sources_and_a_fixed_split():
    from simlib.sim import scale_runs

    rows = scale_runs.load_rows()
    assert len(rows) >= 50 and all(r["source_url"].startswith("https://") for r in rows)
    by_group = {}
    for r in rows:  # within each source and version, file order alternates fit, test
        by_group.setdefault((r["source"], r["version"]), []).append(r["split"])
    for splits in by_group.values():
        assert splits == ["fit" if i % 2 == 0 else "test" for i in range(len(splits))]
    kinds = {k for r in rows for k in scale_runs.kinds_of(r)}
    assert kinds == set(scale_runs.KINDS)
    row = next(
        r
        for r in rows
        if r["model"] == "llama3-405b" and r["cp"] > 1 and r["gpu"] == "h100" and r["source"] == "megatron-bridge"
    )
    out = scale_runs.predict_row(row)
    assert out["expressible"] and out["predicted"] > 0 and "long_context" in out["kinds"]
    dsv3 = scale_runs.predict_row(next(r for r in rows if r["model"] == "deepseek-v3"))
    assert dsv3["expressible"] and dsv3["predicted"] > 0 and "moe" in dsv3["kinds"]
    oss = scale_runs.predict_row(next(r for r in rows if r["model"] == "gpt-oss-120b"))
    assert oss["expressible"] and oss["predicted"] > 0
    # a pp × vp with no layout in the release's recipe or configs cannot be stated (pp 8 × vp 4 now can: the
    # release's H100 config writes its 32 chunks; test_sim_scale_causes)
    odd = dict(next(r for r in rows if r["model"] == "deepseek-v3" and r["pp"] * r["vp"] == 32), vp=3)
    odd = scale_runs.predict_row(odd)
    assert not odd["expressible"] and "pipeline layout" in odd["reason"]


def test_power_capped_hopper_parts_are_slower_than_sxm():
    m = sim.llama_size("llama3-8b")
    s = sim.Strategy(dp=8, micro_batch=1, num_micro_batches=4, attention="flash", zero_stage=1, dtype="fp8")
    sxm, nvl, pcie = (sim.predict(m, sim.preset(name), s).step_time for name in ("h100", "h100-nvl", "h100-pcie"))
    assert sxm < nvl < pcie
    assert sim.preset("h100-nvl").memory_bytes > sim.preset("h100").memory_bytes


def test_ep_overlap_hides_the_all_to_alls_behind_a_layers_compute():
    """Megatron's overlap_moe_expert_parallel_comm: what fits in the layer's forward + backward compute is hidden,
    and that compute slows by the overlap's SM share (overlap.TP_OVERLAP_GEMM_SLOWDOWN of the hidden time)."""
    from simlib.sim.overlap import TP_OVERLAP_GEMM_SLOWDOWN

    m, hw = sim.llama_size("qwen3-30b-a3b"), sim.dgx_h100()
    for dp, ep in ((8, 8), (32, 32)):  # inside one node: all hidden; across four nodes: partly exposed
        s = sim.Strategy(dp=dp, ep=ep, attention="flash", micro_batch=1, num_micro_batches=4, zero_stage=1)
        plain, over = gpt_stage(m, hw, s), gpt_stage(m, hw, s.replace(ep_overlap=True))
        hidden = plain["ep_comm"] - over["ep_comm"]
        assert hidden > 0 and over["ep_comm"] >= 0
        slower = over["forward"] + over["backward"] - plain["forward"] - plain["backward"]
        assert slower == pytest.approx(TP_OVERLAP_GEMM_SLOWDOWN * hidden)
        compute = plain["forward"] + plain["backward"]
        assert hidden <= compute * (1 + 1e-9)
        assert (over["ep_comm"] == 0.0) if ep == 8 else (over["ep_comm"] > 0.0)
    with pytest.raises(ValueError, match="ep > 1"):
        sim.Strategy(ep_overlap=True)


def test_recipe_settings_the_tables_do_not_show():
    from simlib.sim import scale_runs

    rows = [
        r
        for r in scale_runs.load_rows()
        if r["model"] == "qwen3-235b-a22b" and r["gpu"] == "h100" and r["source"] == "megatron-bridge"
    ]
    assert len(rows) == 2
    for r in rows:  # Megatron-Bridge's Qwen3-235B H100 configs: no TP comm overlap, EP all-to-all overlap
        assert r["tp"] == 2 and scale_runs.recipe_settings(r) == dict(
            tp_overlap=False, ep_overlap=True, recompute_modules=()
        )
        assert "async_tp" not in scale_runs.kinds_of(r)
        s = scale_runs.strategy_of(r, sim.llama_size(r["model"], seq_len=r["seq_len"]))
        assert s.ep_overlap and not s.tp_overlap
    llama = next(r for r in scale_runs.load_rows() if r["model"] == "llama3-70b" and r["tp"] > 1)
    assert scale_runs.recipe_settings(llama) == dict(tp_overlap=True, ep_overlap=False, recompute_modules=())
    oss = next(r for r in scale_runs.load_rows() if r["model"] == "gpt-oss-120b" and r["gpu"] == "h100")
    assert scale_runs.recipe_settings(oss)["recompute_modules"] == ("layernorm", "moe_act")


def test_recompute_modules_rerun_their_operators_in_backward():
    """Megatron's --recompute-modules: backward re-runs exactly those operators' forward (moe_act: the experts'
    activation; mla_up_proj: MLA's up projections and rotary part)."""
    from simlib.sim.layer import op_time
    from simlib.sim.layer_strategy import module_recompute_ops, strategy_layer_ops

    hw = sim.dgx_h100()
    m = sim.llama_size("deepseek-v3")
    s = sim.Strategy(dp=8, ep=8, attention="flash", micro_batch=1, num_micro_batches=2, zero_stage=1)
    fwd = strategy_layer_ops(m, s, expert_layer=True)["forward"]
    again = module_recompute_ops(fwd, ("moe_act", "mla_up_proj"))
    assert sorted(op.name for op in again) == sorted(
        ["recompute experts SwiGLU", "recompute MLA q up", "recompute MLA kv up", "recompute rotary embedding on Q, K"]
    )
    base, more = gpt_stage(m, hw, s), gpt_stage(m, hw, s.replace(recompute_modules=("moe_act", "mla_up_proj")))
    moe_layers = m.moe_layers + m.mtp_layers  # pp = 1: every layer here; the dense ones re-run MLA's part only
    dense_again = module_recompute_ops(strategy_layer_ops(m, s)["forward"], ("moe_act", "mla_up_proj"))
    extra = moe_layers * sum(op_time(op, hw, s) for op in again) + m.dense_layers * sum(
        op_time(op, hw, s) for op in dense_again
    )
    assert more["backward"] - base["backward"] == pytest.approx(extra)
    assert more["forward"] == base["forward"]
    with pytest.raises(ValueError, match="recompute_modules"):
        sim.Strategy(recompute_modules=("attention",))
    with pytest.raises(ValueError, match="recompute_modules"):
        sim.Strategy(recompute="full", recompute_modules=("moe_act",))
