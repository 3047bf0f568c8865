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


def test_blackwell_softmax_exponentials_bound_the_attention_forward():
    """The special-function units limit a fused attention forward on Blackwell (one exponential per visible score):
    a head of 64 does half the FLOPs of a head of 128 per score but is no faster there; Blackwell Ultra's doubled
    SFU throughput lifts that bound; backward at head 128 stays tensor-core bound; Hopper is not SFU-bound."""
    from simlib.sim import presets
    from simlib.sim.layer import attention_rate, op_time
    from simlib.sim.ops import Op

    def fwd(d, hw, direction="forward"):
        name = "flash attention" + (" backward" if direction == "backward" else "")
        op = Op(name, "attention", 0.0, (8192, d, 8192), 64)
        return op, op_time(op, hw)

    b200, gb300, h100 = sim.preset("b200"), sim.preset("gb300"), sim.dgx_h100()
    op64, t64 = fwd(64, b200)
    op128, t128 = fwd(128, b200)
    assert op64.exps == op128.exps == 8192 * 8192 / 2 * 64
    assert t64 == pytest.approx(op64.exps / presets.BLACKWELL_EXP_RATE) == pytest.approx(t128)
    assert t64 > op64.flops / attention_rate(b200, "forward")  # slower than the tensor cores alone
    _, u64 = fwd(64, gb300)
    assert u64 < t64 and gb300.exp_rate == pytest.approx(2 * b200.exp_rate)
    back, tb = fwd(128, b200, "backward")
    assert tb == pytest.approx(back.flops / attention_rate(b200, "backward"))
    op, th = fwd(64, h100)
    assert h100.exp_rate == 0.0 and th == pytest.approx(op.flops / attention_rate(h100, "forward"))


def test_fp8_expert_gemms_cast_their_gradients_as_a_dense_layer_does():
    """Under FP8 each grouped GEMM casts its input forward and its incoming gradient backward, with the bytes per
    element of the dense layer's casts (current scaling reads once more than delayed); bf16 has no cast."""
    from simlib.sim.layer import layer_ops

    m = sim.llama_size("qwen3-30b-a3b")
    dense = {op.name: op for op in layer_ops(m, 1, fp8="current", attention="flash")["backward"]}
    t, h, f = m.seq_len, m.hidden, m.ffn
    per_element = dense["MLP down grad FP8 cast + transpose"].bytes / (t * h)
    assert dense["MLP up grad FP8 cast + transpose"].bytes / (t * 2 * f) == per_element
    for recipe in ("current", "delayed"):
        ops = cluster_ops.moe_ops(m, t, 1, 8, fp8=recipe)
        rows = cluster_ops.expert_rows(m, t)
        back = {op.name: op.bytes for op in ops["backward"] if "FP8" in op.name}
        fwd = {op.name: op.bytes for op in ops["forward"] if "FP8" in op.name}
        want = per_element if recipe == "current" else per_element - 2
        assert back == {
            "experts down grad FP8 cast + transpose": want * rows * h,
            "experts up grad FP8 cast + transpose": want * rows * 2 * m.expert_width,
        }
        assert fwd == {"experts FP8 cast": want * rows * h, "experts FP8 cast (down)": want * rows * m.expert_width}
    assert not [op for op in cluster_ops.moe_ops(m, t, 1, 8)["backward"] if "FP8" in op.name]


def test_activation_offload_frees_memory_and_costs_only_what_compute_does_not_hide():
    """Megatron-Core's CPU offloading (TE's double-buffered handler): n of a stage's L layers keep their activations
    in host memory, so the device holds L − n layers' worth; each copy runs beside L // n layers of compute and only
    what it takes beyond that is exposed, forward (to the host) and backward (back); no host link stated (a CPU
    box): refused."""
    from simlib.sim import memory, offload, presets

    m = sim.llama_size("llama3-70b", seq_len=8192)
    s = sim.Strategy(
        dp=64,
        micro_batch=2,
        num_micro_batches=2,
        zero_stage=3,
        fsdp=True,
        attention="flash",
        dtype="fp8",
        fp8_recipe="current",
    )
    layer = memory.activation_bytes_per_layer(
        m,
        2,
        1,
        "none",
        s.sequence_parallel,
        "flash",  # as memory counts it
        memory.kept_value_bytes(s),
        **memory.saved_by(s),
    )
    off = s.replace(offload_layers=20)
    assert memory.memory_per_device(m, s)["activations"] - memory.memory_per_device(m, off)[
        "activations"
    ] == pytest.approx(20 * layer)
    gb300 = sim.preset("gb300")
    assert gb300.host_link == presets.GRACE_C2C_PER_GPU and sim.preset("b200").host_link == presets.PCIE5_X16
    assert sim.dgx_h100().host_link == presets.PCIE5_X16 and sim.cpu_box().host_link == 0.0
    copy = layer / gb300.host_link
    # a window of 80 // 20 = 4 layers: hidden when 4 layers' compute outlasts the copy, exposed by the rest if not
    assert offload.offload_exposed(off, gb300, 80, layer, copy / 4, copy / 2) == 0.0
    assert offload.offload_exposed(off, gb300, 80, layer, copy / 8, copy / 2) == pytest.approx(20 * copy / 2)
    assert offload.offload_exposed(s, gb300, 80, layer, 0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="host link"):
        offload.offload_exposed(off, sim.cpu_box(), 80, layer, 0.0, 0.0)
    # the recipe's setting reaches the FSDP rows only (the MXFP8 70B rows run pp 4 × vp 5 without it)
    # (cpu_offloading_num_layers of Megatron-Bridge's Llama 3 70B Megatron-FSDP configs, by gpu and precision)
    offloaded = {
        ("gb300", "bf16"): 30,
        ("gb300", "fp8"): 20,
        ("gb200", "bf16"): 20,
        ("gb200", "fp8"): 40,
        ("b200", "fp8"): 5,
    }
    rows = [r for r in scale_runs.load_rows() if r["model"] == "llama3-70b" and r["source"] == "megatron-bridge"]
    for r in rows:
        got = scale_runs.recipe_settings(r).get("offload_layers", 0)
        assert got == (offloaded.get((r["gpu"], r["precision"]), 0) if r["fsdp"] else 0)
    p_on, p_off = (sim.predict(m, gb300, x) for x in (off, s))
    assert p_on.as_row()["offload"] >= 0.0 and p_on.step_time >= p_off.step_time


def test_deepseek_v3_pp8_vp4_takes_the_releases_32_chunk_layout():
    """v0.2.2's only DeepSeek-V3 layout of 32 chunks ("Et|(tt|)*30mL": embedding + 1 layer, 30 chunks of 2, MTP and
    loss alone) summed per pipeline rank (rank r holds chunks r, r + 8, ...): all 61 layers, the first rank one
    fewer, the last rank two fewer (its last chunk holds the MTP block and the loss); the 25.11 GB200 row is stated."""
    assert scale_runs.deepseek_v3_layout(8, 4) == (7, 8, 8, 8, 8, 8, 8, 6)
    assert sum(scale_runs.deepseek_v3_layout(8, 4)) == 61
    assert scale_runs.deepseek_v3_layout(8, 3) is None
    row = next(r for r in scale_runs.load_rows() if r["model"] == "deepseek-v3" and (r["pp"], r["vp"]) == (8, 4))
    assert not scale_runs.why_inexpressible(row)
    assert scale_runs.predict_row(row)["expressible"]
