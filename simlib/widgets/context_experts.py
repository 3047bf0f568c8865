"""Lesson 09's explorers: long context (memory and communication per rank) and mixture of experts (load, drops,
all-to-all volume). Pure ``*_figure`` functions built on the library's formulas, and ``*_explorer`` widgets that
wire controls to them (``simlib.widgets`` re-exports both explorers).
"""

from __future__ import annotations

import numpy as np

from .. import plots
from ._common import _figure, _wire


def context_figure(
    seq: int = 4096,
    cp: int = 4,
    heads: int = 8,
    batch: int = 1,
    head_dim: int = 64,
    layout: str = "zigzag",
    measured=None,
):
    """Per-rank attention memory against sequence length (cp = 1, 2, 4, 8), bytes each rank sends (ring vs
    Ulysses) against cp, and causal work per rank (plain vs zig-zag) at ``cp``.

    ``measured``: rows with ``cp``, ``seq``, ``measured_MB`` (lesson 09's memory sweep) to mark.
    Returns (figure, caption).
    """
    from ..parallel import context

    if seq % (2 * cp):
        raise ValueError(f"sequence length {seq} does not split into 2·cp = {2 * cp} equal chunks")
    fig, (ax_m, ax_c, ax_w) = _figure(3, (14, 3.8))
    seqs = [s for s in (2**i for i in range(8, 18)) if s % 16 == 0]
    for degree, style in zip((1, 2, 4, 8), ("k-", "b-", "g-", "m-")):
        mem = [context.memory_per_rank(batch, heads, s, head_dim, degree, "contiguous")["total"] / 2**20 for s in seqs]
        ax_m.loglog(seqs, mem, style, label=f"cp={degree} (formula)")
    rows = measured.to_dict("records") if hasattr(measured, "to_dict") else (measured or [])
    colours = {1: "k", 2: "b", 4: "g", 8: "m"}
    for r in rows:
        ax_m.plot(r["seq"], r["measured_MB"], "o", color=colours.get(r["cp"], "r"), ms=6)
    if rows:
        ax_m.plot([], [], "o", color="gray", label="measured here (other B, H, D)")
    ax_m.axvline(seq, color="r", lw=0.8)
    ax_m.set(xlabel="sequence length S", ylabel="MB per rank (one forward)", title="attention memory per rank")
    degrees = [d for d in (1, 2, 4, 8, 16) if seq % (2 * d) == 0]
    ring = [context.comm_volume(batch, heads, seq, head_dim, d, "ring")["total"] / 2**20 for d in degrees]
    ax_c.plot(degrees, ring, "o-", label="ring (K/V around, dK/dV back)")
    ok = [d for d in degrees if heads % d == 0]
    ax_c.plot(
        ok,
        [context.comm_volume(batch, heads, seq, head_dim, d, "ulysses")["total"] / 2**20 for d in ok],
        "s-",
        label=f"Ulysses (needs heads % cp == 0; H={heads})",
    )
    ax_c.set_xscale("log", base=2)
    ax_c.set(xlabel="cp", ylabel="MB sent per rank (fwd + bwd)", title=f"communication at S={seq}")
    plain, zig = context.causal_work(seq, cp, "contiguous"), context.causal_work(seq, cp, "zigzag")
    x = np.arange(cp)
    ax_w.bar(x - 0.2, plain, 0.4, label=f"plain split (slowest {context.imbalance(plain):.2f}x mean)")
    ax_w.bar(x + 0.2, zig, 0.4, label=f"zig-zag (slowest {context.imbalance(zig):.2f}x mean)")
    ax_w.set(xlabel="rank", ylabel="score entries per (batch, head)", title=f"causal work per rank, cp={cp}")
    plots.integer_ticks(ax_w)
    for ax in (ax_m, ax_c, ax_w):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    mem = context.memory_per_rank(batch, heads, seq, head_dim, cp, layout)
    ring_b = context.comm_volume(batch, heads, seq, head_dim, cp, "ring")["total"]
    uly = (
        f"Ulysses {context.comm_volume(batch, heads, seq, head_dim, cp, 'ulysses')['total'] / 2**20:.3g} MB"
        if heads % cp == 0
        else f"Ulysses impossible ({heads} heads do not divide by cp={cp})"
    )
    caption = (
        f"S={seq}, cp={cp}, B={batch}, H={heads}, D={head_dim}, {layout} split: {mem['total'] / 2**20:.3g} MB "
        f"per rank for one forward ({mem['scores'] / mem['total']:.0%} of it the score block); each rank sends "
        f"{ring_b / 2**20:.3g} MB with ring attention, {uly}, per forward + backward. "
        f"Causal work: plain split's slowest rank {context.imbalance(plain):.2f}x the mean, zig-zag "
        f"{context.imbalance(zig):.2f}x."
    )
    return fig, caption


def context_explorer(measured=None):
    """Sequence length, cp, heads, head size and split -> memory, communication and causal work per rank."""
    import ipywidgets as W

    controls = dict(
        seq=W.SelectionSlider(options=[2**i for i in range(10, 18)], value=4096, description="seq S"),
        cp=W.SelectionSlider(options=[1, 2, 4, 8], value=4, description="cp"),
        heads=W.SelectionSlider(options=[4, 6, 8, 12, 16, 32], value=8, description="heads H"),
        head_dim=W.SelectionSlider(options=[32, 64, 128], value=64, description="head dim D"),
        batch=W.SelectionSlider(options=[1, 2, 4, 8], value=1, description="batch B"),
        layout=W.Dropdown(options=["zigzag", "contiguous"], description="split"),
    )
    return _wire(controls, lambda **v: context_figure(measured=measured, **v))


def expected_load(tokens: int, num_experts: int, top_k: int = 1, skew: float = 0.0) -> np.ndarray:
    """Assignments each expert expects when the router's preference decays as exp(-skew · e / E) (0: uniform)."""
    weights = np.exp(-skew * np.arange(num_experts) / num_experts)
    return tokens * top_k * weights / weights.sum()


def moe_figure(
    num_experts: int = 8,
    ep: int = 4,
    capacity_factor: float = 1.25,
    top_k: int = 2,
    tokens: int = 4096,
    hidden: int = 1024,
    skew: float = 0.0,
    measured=None,
):
    """Load per expert against the capacity (what is dropped), load per rank, and the all-to-all bytes per rank.

    ``measured``: a list of tokens per expert (lesson 09's run) to draw beside the model, scaled to ``tokens``.
    Returns (figure, caption).
    """
    from ..parallel.experts import a2a_volume, capacity

    if num_experts % ep:
        raise ValueError(f"{num_experts} experts do not split evenly over ep = {ep}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be between 1 and {num_experts}")
    load = expected_load(tokens, num_experts, top_k, skew)
    cap = capacity(tokens, num_experts, top_k, capacity_factor)
    kept = np.minimum(load, cap)
    dropped = float((load - kept).sum())
    fig, (ax_e, ax_r, ax_v) = _figure(3, (14, 3.8))
    e = np.arange(num_experts)
    ax_e.bar(e, kept, color="tab:blue", label="kept")
    ax_e.bar(e, load - kept, bottom=kept, color="tab:red", label="dropped")
    ax_e.axhline(cap, color="k", ls="--", label=f"capacity {cap}")
    if measured is not None and len(measured) == num_experts:
        m = np.asarray(measured, dtype=float)
        ax_e.plot(e, m * tokens * top_k / max(m.sum(), 1), "ko", ms=5, label="measured here (scaled)")
    ax_e.set(xlabel="expert", ylabel="token assignments", title="load per expert")
    plots.integer_ticks(ax_e)
    per_rank = kept.reshape(ep, -1).sum(1)
    ax_r.bar(np.arange(ep), per_rank, color="tab:green")
    ax_r.axhline(per_rank.mean(), color="k", ls=":", label="mean")
    ax_r.set(xlabel="rank (holds E/ep experts)", ylabel="tokens to compute", title="load per rank")
    plots.integer_ticks(ax_r)
    degrees = [d for d in (1, 2, 4, 8, 16, 32, 64) if num_experts % d == 0]
    share = kept.sum() / load.sum()
    ax_v.plot(
        degrees,
        [a2a_volume(tokens // d, hidden, top_k, d, 2, share)["dispatch"] / 2**20 for d in degrees],
        "o-",
        label="dispatch (= combine), bf16",
    )
    ax_v.set_xscale("log", base=2)
    ax_v.set(xlabel="ep", ylabel="MB sent per rank", title=f"all-to-all per rank, {tokens} tokens in all")
    for ax in (ax_e, ax_r, ax_v):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    vol = a2a_volume(tokens // ep, hidden, top_k, ep, 2, share)
    caption = (
        f"E={num_experts}, ep={ep}, top-{top_k}, capacity factor {capacity_factor}: capacity {cap} per expert; "
        f"{dropped:.0f} of {tokens * top_k} assignments dropped ({dropped / (tokens * top_k):.0%}); the busiest "
        f"rank computes {per_rank.max() / per_rank.mean():.2f}x the mean; each rank sends "
        f"{vol['dispatch'] / 2**20:.3g} MB in the dispatch and again in the combine (bf16, H={hidden}), "
        f"{vol['step'] / 2**20:.3g} MB per forward + backward."
    )
    return fig, caption


def moe_explorer(measured=None):
    """Experts, ep, capacity factor, top-k and router skew -> load per expert and rank, drops, all-to-all bytes."""
    import ipywidgets as W

    controls = dict(
        num_experts=W.SelectionSlider(options=[4, 8, 16, 32, 64], value=8, description="experts E"),
        ep=W.SelectionSlider(options=[1, 2, 4, 8], value=4, description="ep"),
        capacity_factor=W.SelectionSlider(
            options=[0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 4.0], value=1.25, description="capacity"
        ),
        top_k=W.SelectionSlider(options=[1, 2, 4], value=2, description="top-k"),
        skew=W.FloatSlider(value=0.0, min=0.0, max=5.0, step=0.5, description="router skew", continuous_update=False),
        hidden=W.SelectionSlider(options=[256, 1024, 4096], value=1024, description="hidden H"),
    )
    return _wire(controls, lambda **v: moe_figure(measured=measured, **v))
