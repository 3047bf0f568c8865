"""Lesson 09's explorers: their numbers are the library's formulas; impossible choices are refused."""

import matplotlib
import pytest

matplotlib.use("Agg")


def test_context_figure_caption_is_the_formulas():
    from simlib.parallel import context
    from simlib.widgets import context_figure

    fig, caption = context_figure(seq=4096, cp=4, heads=6, batch=1, head_dim=64, layout="zigzag")
    mem = context.memory_per_rank(1, 6, 4096, 64, 4, "zigzag")["total"] / 2**20
    assert f"{mem:.3g} MB per rank" in caption
    assert "Ulysses impossible (6 heads do not divide by cp=4)" in caption
    assert "plain split's slowest rank 1.60x the mean, zig-zag 1.00x" in caption
    with pytest.raises(ValueError, match="does not split"):
        context_figure(seq=1000, cp=8)


def test_moe_figure_counts_drops_against_capacity():
    import numpy as np

    from simlib.parallel.experts import capacity
    from simlib.widgets import moe_figure
    from simlib.widgets.context_experts import expected_load

    load = expected_load(4096, 8, 2, skew=2.0)
    cap = capacity(4096, 8, 2, 1.25)
    dropped = float(np.maximum(load - cap, 0).sum())
    _, caption = moe_figure(num_experts=8, ep=4, capacity_factor=1.25, top_k=2, tokens=4096, skew=2.0)
    assert f"capacity {cap} per expert; {dropped:.0f} of 8192 assignments dropped" in caption
    _, uniform = moe_figure(skew=0.0, capacity_factor=1.0)
    assert "0 of 8192 assignments dropped" in uniform and "busiest rank computes 1.00x" in uniform
    with pytest.raises(ValueError, match="do not split evenly"):
        moe_figure(num_experts=6, ep=4)


def test_explorers_build():
    from simlib import widgets

    assert widgets.context_explorer() is not None and widgets.moe_explorer(measured=[1] * 8) is not None
