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
    assert one["comm"] == 0 and four["comm"] == pytest.approx(4 * four["all_to_all"])
    assert four["compute"] < one["compute"]
    with pytest.raises(ValueError, match="split evenly"):
        moe_layer_time(8192, 1024, 6, 4, hw)
