"""The cost model for lesson 09's layers: all-to-all, ring/Ulysses attention, MoE — against hand calculations."""

import pytest


def test_all_to_all_is_alpha_beta_with_the_all_gather_factor():
    from simlib.sim.context_experts import all_to_all
    from simlib.sim.hardware import Link

    link = Link(1e-5, 1e9)
    assert all_to_all(8e6, 4, link) == pytest.approx(3 * 1e-5 + 0.75 * 8e6 / 1e9)
    assert all_to_all(8e6, 1, link) == 0.0


def test_zigzag_predicted_faster_than_plain_and_ulysses_needs_heads():
    from simlib import sim
    from simlib.sim.context_experts import ring_attention_time, ulysses_time

    hw = sim.preset("h100")
    plain = ring_attention_time(1, 32, 65536, 128, 4, hw, "contiguous")
    zig = ring_attention_time(1, 32, 65536, 128, 4, hw, "zigzag")
    assert zig["total"] < plain["total"]
    assert max(plain["compute"]) / (sum(plain["compute"]) / 4) == pytest.approx(1.6)
    assert ulysses_time(1, 32, 65536, 128, 4, hw)["total"] > 0
    with pytest.raises(ValueError, match="divisible"):
        ulysses_time(1, 6, 4096, 64, 4, hw)


def test_moe_layer_time_counts_both_all_to_alls():
    from simlib import sim
    from simlib.sim.context_experts import moe_layer_time

    hw = sim.preset("h100")
    one = moe_layer_time(8192, 1024, 8, 1, hw)
    four = moe_layer_time(8192, 1024, 8, 4, hw)
    assert one["comm"] == 0 and four["comm"] == pytest.approx(4 * four["all_to_all"] + four["counts"])
    assert 0 < four["counts"] < four["all_to_all"]  # the routing counts: small messages before the dispatch
    assert four["compute"] < one["compute"]
    with pytest.raises(ValueError, match="split evenly"):
        moe_layer_time(8192, 1024, 6, 4, hw)


def _measured_box(sync=None):
    """The cpu_box preset with a kernels table as calibrate(kernels=True) leaves it (numbers made up, shapes real)."""
    from simlib import sim

    lengths = (64, 128, 256, 512)

    def table(per_entry, per_call):  # seconds = per_call + per_entry · L² (8 heads), backward 3× forward
        return {
            "forward": [(n, per_call + per_entry * n * n) for n in lengths],
            "backward": [(n, 3 * (per_call + per_entry * n * n)) for n in lengths],
        }

    kernels = {
        "ring_full": table(1e-8, 1e-4),
        "ring_diagonal": table(3e-8, 2e-4),
        "sdpa": table(2e-8, 1e-4),
        "op": 1e-5,
    }
    if sync is not None:
        kernels["sync"] = sync
    return sim.preset("cpu").with_(overheads={"kernels": {2: kernels}})


def test_kernel_table_is_read_per_block_and_scaled_by_heads():
    from simlib import sim
    from simlib.sim.context_experts import kernel_time

    hw = _measured_box()
    assert kernel_time(sim.preset("h100"), "ring_full", 128, 8, 2) is None  # presets measure no kernels
    assert kernel_time(hw, "ring_full", 128, 8, 2, backward=False) == pytest.approx(1e-4 + 1e-8 * 128**2)
    assert kernel_time(hw, "ring_full", 192, 8, 2) == pytest.approx(3 * (1e-4 + 1e-8 * 192**2))  # linear in L²
    assert kernel_time(hw, "ring_full", 128, 16, 2) == pytest.approx(2 * kernel_time(hw, "ring_full", 128, 8, 2))
    kernels = hw.overheads["kernels"][2]
    d64 = {way: [(n, 2 * t) for n, t in pts] for way, pts in kernels["ring_full"].items()}
    hw = hw.with_(overheads={"kernels": {2: {**kernels, "ring_full/d64": d64}}})  # measured at head_dim 64 too
    one = kernel_time(hw, "ring_full", 128, 8, 2)
    assert kernel_time(hw, "ring_full", 128, 8, 2, head_dim=64) == pytest.approx(2 * one)
    assert (
        kernel_time(hw, "ring_full", 128, 8, 2, head_dim=32)
        == kernel_time(hw, "ring_full", 128, 8, 2, head_dim=128)
        == one
    )


def test_measured_ring_counts_full_and_diagonal_blocks_per_rank():
    from simlib.sim.context_experts import kernel_time, ring_attention_time

    hw = _measured_box()
    zig = ring_attention_time(2, 4, 512, 32, 2, hw, "zigzag", dtype="fp32", backward=False)
    plain = ring_attention_time(2, 4, 512, 32, 2, hw, "contiguous", dtype="fp32", backward=False)
    full, diag = (kernel_time(hw, k, 128, 8, 2, backward=False) for k in ("ring_full", "ring_diagonal"))
    assert zig["compute"] == pytest.approx([3 * full + 2 * diag] * 2)  # zig-zag: 5 blocks each, 2 on the diagonal
    full, diag = (kernel_time(hw, k, 256, 8, 2, backward=False) for k in ("ring_full", "ring_diagonal"))
    assert plain["compute"] == pytest.approx([diag, full + diag])  # contiguous: rank 1 also sees rank 0's block
    assert max(plain["compute"]) > max(zig["compute"])


def test_measured_sync_prices_every_blocking_collective():
    from simlib.sim.context_experts import moe_layer_time, ulysses_time

    slow, fast = _measured_box(sync=5e-3), _measured_box(sync=1e-4)
    # Ulysses waits on 8 all-to-alls and one shape check; the MoE layer on 2 routing collectives and 4 all-to-alls
    gap = (
        ulysses_time(2, 4, 512, 32, 2, slow, dtype="fp32")["total"]
        - ulysses_time(2, 4, 512, 32, 2, fast, dtype="fp32")["total"]
    )
    assert gap == pytest.approx(9 * (5e-3 - 1e-4))
    moe = [moe_layer_time(256, 64, 8, 2, hw, top_k=2, dtype="fp32")["total"] for hw in (slow, fast)]
    assert moe[0] - moe[1] == pytest.approx(6 * (5e-3 - 1e-4))
    # the eager ops: more experts per rank, more ops (each expert's selection, Linears, GELU, copy back)
    few, many = (moe_layer_time(256, 64, e, 2, fast, top_k=2, dtype="fp32")["compute"] for e in (4, 16))
    assert many - few > 6 * (10 + 22) * 1e-5


def test_combine_kernels_keeps_the_slowest_rank_and_fits_gloo_all_to_all():
    from simlib.sim.context_experts import all_to_all_time
    from simlib.sim.kernels import combine_kernels

    def rank(scale):
        return {
            "kernels": {
                "ring_full": {
                    "forward": [(64, 1e-3 * scale), (128, 3e-3 * scale)],
                    "backward": [(64, 3e-3 * scale), (128, 9e-3 * scale)],
                },
                "op": 1e-5 * scale,
                "sync": 1e-3 * scale,
                "a2a": [(n, 1e-4 * scale + n / 1e8) for n in (4096, 65536, 1 << 20)],
            }
        }

    out = combine_kernels([rank(1.0), rank(2.0), None])  # None: a rank outside the measured world size
    assert out["ring_full"]["forward"] == [(64, 2e-3), (128, 6e-3)]
    assert out["op"] == 2e-5 and out["sync"] == 2e-3
    alpha, bandwidth = out["a2a"]
    assert alpha == pytest.approx(2e-4, rel=1e-3) and bandwidth == pytest.approx(1e8, rel=1e-3)
    assert combine_kernels([{"kernels": None}, None]) is None  # calibrate() without kernels=True
    hw = _measured_box()
    hw = hw.with_(overheads={"kernels": {2: {**hw.overheads["kernels"][2], "a2a": (2e-4, 1e8)}}})
    assert all_to_all_time(65536, 2, hw) == pytest.approx(2e-4 + 65536 / 1e8)


def test_in_situ_calls_and_the_zigzag_step_replace_the_alpha_beta_guesses():
    """calibrate(kernels=True) on a box whose ranks share cores: the calls priced by what they add to compute."""
    from simlib.sim.context_experts import kernel_time, moe_layer_time, ring_attention_time, ulysses_time

    hw = _measured_box(sync=1e-3)
    base = hw.overheads["kernels"][2]
    fits = {"a2a": (2e-3, 1e8), "hop": (1e-3, 2e8), "hop_overlapped": (3e-3, 5e7)}
    zigzag = {way: [(n, 10 * t) for n, t in pts] for way, pts in base["ring_full"].items()}
    measured = hw.with_(overheads={"kernels": {2: {**base, "in_situ": fits, "ring_zigzag": zigzag}}})
    kv = 2 * 2 * 4 * 256 * 32 * 4  # one K/V pair at B=2, H=4, S/cp=256, D=32, fp32
    ring = ring_attention_time(2, 4, 512, 32, 2, measured, "zigzag", dtype="fp32")
    full, zz = (kernel_time(measured, k, 128, 8, 2) for k in ("ring_full", "ring_zigzag"))
    assert ring["compute"] == pytest.approx([zz + 2 * full] * 2)  # own step measured whole, then 2 full blocks
    comm = ring["per_rank"][0] - ring["compute"][0]
    # two K/V passes overlapped with compute, two dK/dV passes after it, the shape check (its wait: the sync, 1 ms)
    assert comm == pytest.approx(2 * (3e-3 + kv / 5e7) + 2 * (1e-3 + kv / 2e8) + 1e-3, rel=1e-5)
    uly = [ulysses_time(2, 4, 512, 32, 2, box, dtype="fp32") for box in (hw, measured)]
    assert uly[1]["all_to_all"] == pytest.approx(2e-3 + 2 * 4 * 256 * 32 * 4 / 1e8)
    assert uly[0]["all_to_all_in_step"] == uly[0]["all_to_all"]  # unmeasured: every call alike
    # measured: the output, dO and dq meet the ranks after compute; q, k, v, dk, dv follow another collective
    assert uly[1]["total"] - uly[0]["total"] == pytest.approx(
        3 * (uly[1]["all_to_all"] - uly[0]["all_to_all"]) + 5 * (uly[1]["all_to_all_in_step"] - uly[0]["all_to_all"])
    )
    assert (
        moe_layer_time(256, 64, 8, 2, measured, top_k=2, dtype="fp32")["all_to_all"]
        > moe_layer_time(256, 64, 8, 2, hw, top_k=2, dtype="fp32")["all_to_all"]
    )


def test_moe_op_cost_comes_from_the_measured_layer():
    from simlib.sim.context_experts import (
        OPS_BACKWARD,
        OPS_FORWARD,
        OPS_PER_EXPERT_BACKWARD,
        OPS_PER_EXPERT_FORWARD,
        _moe_compute,
        moe_layer_time,
        moe_op_time,
    )

    hw = _measured_box()
    base = hw.overheads["kernels"][2]
    cal = dict(tokens=64, hidden=32, num_experts=4, top_k=2, capacity_factor=1.25)
    gemms, ops, _ = _moe_compute(64, 32, 4, 1, hw, 2, 1.25, 128, "fp32", True, 2)
    assert ops == OPS_FORWARD + OPS_BACKWARD + 4 * (OPS_PER_EXPERT_FORWARD + OPS_PER_EXPERT_BACKWARD)
    measured = hw.with_(overheads={"kernels": {2: {**base, "moe": dict(cal, seconds=gemms + ops * 4e-5)}}})
    assert moe_op_time(hw, 2) == 1e-5  # no layer measured: the tiny op's cost
    assert moe_op_time(measured, 2) == pytest.approx(4e-5)  # the layer's time less its GEMMs, per op
    slow, fast = (moe_layer_time(256, 64, 8, 2, box, top_k=2, dtype="fp32")["compute"] for box in (measured, hw))
    _, ops_ep2, _ = _moe_compute(256, 64, 8, 2, hw, 2, 1.25, 256, "fp32", True, 2)
    assert slow - fast == pytest.approx(ops_ep2 * 3e-5)


def test_combine_kernels_fits_in_situ_calls_and_keeps_the_slowest_moe():
    from simlib.sim.kernels import combine_kernels

    def rank(scale):
        return {
            "kernels": {
                "moe": dict(tokens=64, seconds=1e-3 * scale),
                "in_situ": {"hop": [(n, scale * (1e-3 + n / 1e9)) for n in (16384, 1 << 20, 4 << 20)]},
            }
        }

    out = combine_kernels([rank(1.0), rank(3.0)])
    assert out["moe"] == dict(tokens=64, seconds=3e-3)
    alpha, bandwidth = out["in_situ"]["hop"]
    assert alpha == pytest.approx(3e-3, rel=1e-3) and bandwidth == pytest.approx(1e9 / 3, rel=1e-3)


def test_a_whole_gpt_prices_simlibs_ring_passes_as_lesson_09_on_a_measured_box():
    """gpt_stage (the planner's operator model) and ring_attention_time price the same passes of the same ring:
    on a box whose passes calibrate() measured in situ, a cp = 2 layer's exposed context-parallel time is the
    passes lesson 09 counts (forward: 1 overlapped K/V pass and the shape check; backward: 1 K/V pass and 2
    dK/dV passes); a preset keeps the ring hidden behind attention (cluster_ops.exposed_comm)."""
    from simlib import sim
    from simlib.sim.cost import gpt_stage

    hw = _measured_box(sync=1e-3)
    base = hw.overheads["kernels"][2]
    fits = {"a2a": (2e-3, 1e8), "hop": (1e-3, 2e8), "hop_overlapped": (3e-3, 5e7)}
    measured = hw.with_(overheads={"kernels": {2: {**base, "in_situ": fits}}})
    model = sim.gpt(layers=2, hidden=128, heads=4, seq_len=512, vocab=1000)
    s = sim.Strategy(cp=2, cp_kind="ring", micro_batch=2, dtype="fp32")
    kv = 2 * 2 * 512 // 2 * 128 * 4  # K and V of one rank's half of the sequence, fp32
    passes = (3e-3 + kv / 5e7) + 1e-3 + (3e-3 + kv / 5e7) + 2 * (1e-3 + kv / 2e8)  # fwd + check, bwd
    assert gpt_stage(model, measured, s, 2)["cp_comm"] == pytest.approx(model.layers * passes, rel=1e-5)
    assert gpt_stage(model, hw, s, 2)["cp_comm"] < 0.1 * model.layers * passes  # unmeasured: as before
    assert (
        gpt_stage(model, measured, s.replace(cp_kind="allgather"), 2)["cp_comm"]
        == gpt_stage(model, hw, s.replace(cp_kind="allgather"), 2)["cp_comm"]
    )  # another ring: untouched


def test_collectives_of_groups_smaller_than_the_box_are_priced_as_measured_side_by_side():
    """A tp or cp group of 2 on a box of 4 processes sharing the cores: its all-reduce and ring passes cost what
    calibrate() measured groups of 2 add side by side (``in_situ_groups``), not what a 4-rank group or 2 processes
    alone cost; without that measurement a pass falls back on the whole box's, and an all-reduce on the link."""
    from simlib import sim
    from simlib.sim.cost import gpt_stage
    from simlib.sim.layer import op_time
    from simlib.sim.ops import Op
    from simlib.sim.ring_comm import _in_situ, in_situ_all_reduce

    hw = _measured_box(sync=1e-3)
    base = hw.overheads["kernels"][2]
    whole = {"hop": (4e-3, 1e9), "hop_overlapped": (5e-3, 1e9), "all_reduce": (6e-3, 1e9)}
    pairs = {"hop": (1e-3, 2e9), "hop_overlapped": (2e-3, 2e9), "all_reduce": (3e-3, 2e9)}
    box = hw.with_(overheads={"kernels": {4: {**base, "in_situ": whole, "in_situ_groups": {2: pairs}}}})
    assert _in_situ(box, 4, "hop", 2) == pairs["hop"] and _in_situ(box, 4, "hop", 4) == whole["hop"]
    assert in_situ_all_reduce(1e6, 2, box, 4) == pytest.approx(3e-3 + 1e6 / 2e9)
    assert in_situ_all_reduce(1e6, 4, box, 4) == pytest.approx(6e-3 + 1e6 / 1e9)
    assert in_situ_all_reduce(1e6, 2, hw, 4) is None  # unmeasured: the link's α-β instead
    s = sim.Strategy(dp=2, tp=2, micro_batch=2, dtype="fp32")
    op = Op("row-parallel all-reduce", "comm", 2e6, collective="all_reduce", group="tp", count=2)
    assert op_time(op, box, s, 4) == pytest.approx(2 * (3e-3 + 1e6 / 2e9))
    model = sim.gpt(layers=2, hidden=128, heads=4, seq_len=512, vocab=1000)
    ring = sim.Strategy(dp=2, cp=2, cp_kind="ring", micro_batch=2, dtype="fp32")
    kv = 2 * 2 * 512 // 2 * 128 * 4
    bare = hw.with_(overheads={"kernels": {4: {**base, "in_situ": whole}}})
    sides = gpt_stage(model, box, ring, 4)["cp_comm"]
    assert sides < gpt_stage(model, bare, ring, 4)["cp_comm"]  # a pair waits less than the box
    check = gpt_stage(model, box, ring, 4)["cp_comm"] / model.layers - (2 * (2e-3 + kv / 2e9) + 2 * (1e-3 + kv / 2e9))
    assert 0 < check < 2e-3  # what is left: the shape check's wait
