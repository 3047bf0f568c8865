"""The cost model for lesson 09: all-to-all, context-parallel attention (ring and Ulysses) and an MoE layer.

Same method as :mod:`simlib.sim.cost`: α-β collectives on a :class:`~simlib.sim.hardware.Link`, compute from the
hardware's GEMM rates. nccl-tests (PERFORMANCE.md) gives all-to-all the bus-bandwidth factor (n−1)/n, like
all-gather. Kept in its own module so the core cost model stays as it is; :func:`simlib.sim.cost.predict` does
not price these layers yet.
"""
from __future__ import annotations

from ..parallel import context
from ..parallel.experts import a2a_volume, capacity
from .collectives import all_to_all  # noqa: F401 - priced with the other collectives, re-exported here
from .cost import gemm_time, p2p


def _attention_rate(hardware, dtype, processes):
    """FLOP/s of attention's two matmuls, read as one (c×D)·(D×c) GEMM-sized problem per block."""
    return hardware.gemm_rate(1.0, dtype, processes) if hasattr(hardware, "gemm_rate") else None


def ring_attention_time(batch, heads, seq, head_dim, cp, hardware, layout="zigzag", causal=True, dtype="bf16",
                        backward=True, processes=None) -> dict:
    """Predicted seconds of one ring-attention layer (forward, and backward ≈ 2.5× forward's matmuls).

    Each rank's compute is its score entries (:func:`context.causal_work`) × B·H × 4·D flops (QKᵀ and PV);
    each of the cp−1 hops moves one K/V block (2·B·H·S/cp·D elements) point to point and overlaps with the
    block's compute, so a step costs the larger of the two. The layer waits for the slowest rank.
    """
    processes = processes or min(cp, hardware.devices_per_node)
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    work = context.causal_work(seq, cp, layout, causal)
    s_local = seq // cp
    rate = _attention_rate(hardware, dtype, processes)
    hop = p2p(2 * batch * heads * s_local * head_dim * nbytes, hardware.intra) if cp > 1 else 0.0
    factor = 3.5 if backward else 1.0   # forward + backward (dQ, dK, dV and the recomputed scores)
    hops = (cp - 1) * (2 if backward else 1)  # backward also carries dK/dV one hop a step
    compute = [factor * entries * batch * heads * 4 * head_dim / rate for entries in work]
    # each hop hides behind that step's share of the compute; what sticks out is exposed
    per_rank = [c + hops * max(0.0, hop - c / cp) for c in compute]
    return dict(per_rank=per_rank, total=max(per_rank), compute=compute, hop=hop)


def ulysses_time(batch, heads, seq, head_dim, cp, hardware, causal=True, dtype="bf16", backward=True,
                 processes=None) -> dict:
    """Predicted seconds of one Ulysses layer: four all-to-alls each way, then attention on H/cp heads."""
    if heads % cp:
        raise ValueError(f"Ulysses needs heads ({heads}) divisible by cp ({cp})")
    processes = processes or min(cp, hardware.devices_per_node)
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    rate = _attention_rate(hardware, dtype, processes)
    entries = seq * seq / (2 if causal else 1)
    factor = 3.5 if backward else 1.0
    compute = factor * entries * batch * (heads // cp) * 4 * head_dim / rate
    a2a = all_to_all(batch * heads * (seq // cp) * head_dim * nbytes, cp, hardware.intra)
    return dict(total=compute + 4 * a2a * (2 if backward else 1), compute=compute, all_to_all=a2a)


def moe_layer_time(tokens, hidden, num_experts, ep, hardware, top_k=1, capacity_factor=1.25, ffn=None,
                   dtype="bf16", backward=True, processes=None) -> dict:
    """Predicted seconds of one MoE layer on ``ep`` ranks under a uniform router (``tokens`` in the whole batch).

    Compute: the busiest rank's experts run on at most E/ep · capacity tokens (two GEMMs of hidden × ffn);
    communication: the dispatch and the combine all-to-alls (and both again in backward).
    """
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts do not split evenly over ep = {ep}")
    processes = processes or min(ep, hardware.devices_per_node)
    ffn = ffn or 4 * hidden
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    cap = capacity(tokens, num_experts, top_k, capacity_factor)
    rows = min(cap, tokens * top_k / num_experts) * (num_experts // ep)
    forward = gemm_time(rows, hidden, ffn, hardware, dtype, processes) + gemm_time(rows, ffn, hidden, hardware,
                                                                                   dtype, processes)
    compute = forward * (3 if backward else 1)
    vol = a2a_volume(tokens // ep, hidden, top_k, ep, nbytes)
    one = all_to_all(vol["dispatch"] * ep / max(ep - 1, 1), ep, hardware.intra) if ep > 1 else 0.0
    comm = one * (4 if backward else 2)
    return dict(total=compute + comm, compute=compute, all_to_all=one, comm=comm, capacity=cap)
