"""FP8 on Blackwell as Transformer Engine runs it (``benchmarks/sim_scale.py``, issue #35): MXFP8's casts by their
bytes and its GEMMs at the measured ratio to per-tensor FP8; per-tensor casts without a transposed copy; cast kernels
at the bandwidth TE's own GEMM profiling tutorial implies."""

import pytest

from simlib import sim
from simlib.sim import cluster_ops, presets
from simlib.sim.layer import op_time, op_time_key
from simlib.sim.layer_strategy import strategy_layer_ops
from simlib.sim.ops import Op, _gemm, fp8_cast_bytes


def _fp8(recipe, **kw):
    return sim.Strategy(
        dp=8, attention="flash", micro_batch=1, num_micro_batches=1, dtype="fp8", fp8_recipe=recipe, **kw
    )


def _casts(model, strategy, hardware):
    ops = strategy_layer_ops(model, strategy, hardware=hardware)
    return {op.name: op.bytes for op in ops["forward"] + ops["backward"] if " FP8 cast" in op.name}


def test_mxfp8_cast_reads_once_and_writes_two_scaled_copies():
    """One kernel: the 16-bit input read once, a row-wise and a column-wise FP8 copy written, one E8M0 scale byte per
    32 elements of each — fewer bytes than current scaling's amax pass + cast + transpose; the experts use the same
    rule; bf16 casts nothing."""
    assert fp8_cast_bytes("mx", 2) == pytest.approx(2 + 2 + 2 / 32)
    assert fp8_cast_bytes("current", 2) == 6 and fp8_cast_bytes("delayed", 2) == 4 and fp8_cast_bytes(False) == 0
    m = sim.llama_size("llama3-8b")
    t, h = m.seq_len, m.hidden
    mx = _casts(m, _fp8("mx"), sim.dgx_h100())
    assert mx["QKV FP8 cast + transpose"] == pytest.approx((4 + 1 / 16) * t * h)
    q = sim.llama_size("qwen3-30b-a3b")
    rows = cluster_ops.expert_rows(q, q.seq_len)
    experts = {op.name: op.bytes for op in cluster_ops.moe_ops(q, q.seq_len, 1, 8, fp8="mx")["forward"]}
    assert experts["experts FP8 cast"] == pytest.approx((4 + 1 / 16) * rows * q.hidden)


def test_mxfp8_gemms_run_at_the_measured_ratio_to_per_tensor_fp8():
    """TE's tutorial on a B300: 6.812 ms per layer of GEMMs with current scaling, 7.161 with MXFP8 (pre-quantized);
    a math-bound FP8 GEMM takes that much longer under "mx", attention's 16-bit GEMMs do not, and the planner's memo
    keeps the two recipes apart."""
    hw = presets.gb200_nvl72()
    gemm = _gemm("MLP up", 16384, 4096, 28672)
    ratio = op_time(gemm, hw, _fp8("mx")) / op_time(gemm, hw, _fp8("current"))
    assert ratio == pytest.approx(2.365 / 2.158)  # fprop; the layer's 12 GEMMs below
    layer = [
        _gemm("MLP up", 16384, 4096, 28672),
        _gemm("MLP up dgrad", 16384, 28672, 4096),
        _gemm("MLP up wgrad", 4096, 16384, 28672),
    ]
    mx, cs = (sum(op_time(g, hw, _fp8(r)) for g in layer) for r in ("mx", "current"))
    assert mx / cs == pytest.approx(7.162 / 6.812, rel=2e-3)
    scores = _gemm("scores Q·Kᵀ", 8192, 128, 8192, 32)
    assert op_time(scores, hw, _fp8("mx")) == op_time(scores, hw, _fp8("current"))
    assert op_time_key(gemm, hw, _fp8("mx")) != op_time_key(gemm, hw, _fp8("current"))


def test_blackwell_per_tensor_casts_write_no_transpose():
    """Blackwell's FP8 GEMMs take every layout, so TE writes one per-tensor-scaled copy (1 byte per element less than
    on Hopper); MXFP8's two copies are not transposes (block scales run along one axis) and stay; without a
    hardware the Hopper rule holds."""
    m = sim.llama_size("llama3-8b")
    h100, b200 = sim.dgx_h100(), presets.dgx_b200()
    assert not b200.fp8_transpose and h100.fp8_transpose
    for recipe, less in (("current", 1), ("delayed", 1), ("mx", 0)):
        hopper, blackwell = _casts(m, _fp8(recipe), h100), _casts(m, _fp8(recipe), b200)
        assert hopper == _casts(m, _fp8(recipe), None)
        t, h = m.seq_len, m.hidden
        assert hopper["QKV FP8 cast + transpose"] - blackwell["QKV FP8 cast + transpose"] == pytest.approx(less * t * h)


def test_blackwell_cast_kernels_at_the_bandwidth_te_measured():
    """The tutorial's autocast − pre-quantized time per layer, over the casts te.Linear runs before its 12 GEMMs,
    gives 0.68 of a B300's 8 TB/s for its casts (both recipes near it) and 0.89 on an H200 NVL — Calculon's 0.9 for
    any large kernel, so Hopper keeps the table. On Blackwell a large cast is priced at that fraction, other
    memory-bound kernels as before."""
    assert presets.BLACKWELL_CAST_EFFICIENCY == pytest.approx(0.678, abs=0.002)
    for recipe, ms in (("current", 9.147 - 6.812), ("mx", 8.984 - 7.161)):
        assert presets._te_cast_efficiency(8e12, {recipe: ms}, False) == pytest.approx(0.68, abs=0.02)
    assert presets._te_cast_efficiency(4.8e12, {"current": 20.285 - 16.785}, True) == pytest.approx(0.9, abs=0.02)
    hw = presets.gb200_nvl72()
    big = 400e6
    cast, norm = Op("QKV FP8 cast + transpose", "memory", big), Op("RMSNorm 1", "memory", big)
    assert op_time(cast, hw) == pytest.approx(big / (hw.memory_bandwidth * presets.BLACKWELL_CAST_EFFICIENCY))
    assert op_time(norm, hw) == pytest.approx(big / hw.achievable_bandwidth(big))
    assert op_time(cast, sim.dgx_h100()) == op_time(norm, sim.dgx_h100())


def test_blackwell_backward_gemms_slower_than_forward_ones_as_te_measured():
    """The tutorial's B300: dgrad and wgrad passes 1.04x the fprop's time in BF16, 1.08x with per-tensor FP8 (non-TN
    layouts), 1.01x with MXFP8; its H200 NVL 1.00x, so Hopper prices a backward GEMM as a forward one."""
    f = presets.BLACKWELL_BACKWARD_GEMM
    assert f["bf16"] == pytest.approx(1.041, abs=1e-3) and f["fp8"] == pytest.approx(1.078, abs=1e-3)
    assert f["mx"] == pytest.approx(1.014, abs=1e-3)
    fwd, bwd = _gemm("QKV", 16384, 4096, 6144), _gemm("QKV dgrad", 16384, 4096, 6144)
    for hw in (presets.dgx_b200(), presets.dgx_b300(nvl72=True)):
        for recipe, key in (("current", "fp8"), ("mx", "mx")):
            assert op_time(bwd, hw, _fp8(recipe)) / op_time(fwd, hw, _fp8(recipe)) == pytest.approx(f[key])
        assert op_time(bwd, hw) / op_time(fwd, hw) == pytest.approx(f["bf16"])
    assert op_time(bwd, sim.dgx_h100(), _fp8("current")) == op_time(fwd, sim.dgx_h100(), _fp8("current"))
