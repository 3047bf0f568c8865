"""Collectives on a link: α-β formulas and published bus-bandwidth curves.

S bytes, n ranks, per-step latency α, bus bandwidth B (Thakur et al. 2005; nccl-tests PERFORMANCE.md):
    ring all-reduce      2(n−1)·α + 2(n−1)/n · S/B
    tree all-reduce      2·⌈log2 n⌉·α + 2·S/B        (pipelined double binary tree: latency grows with log n)
    all-gather, reduce-scatter   (n−1)·α + (n−1)/n · S/B   (S: the full, gathered size)
    hierarchical all-reduce      reduce-scatter in the node, all-reduce of S/g between nodes, all-gather in the node
A link with a published nccl-tests curve is priced at the bus bandwidth measured for the message size.
"""

from __future__ import annotations

import math


def _check(size, n):
    if size < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {size}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"number of ranks must be an int >= 1, got {n!r}")


def _ab(link, n, size=None):
    """(α, B) of a link for n ranks; with a published bus-bandwidth curve, (0, busbw(size)): nccl-tests' bus
    bandwidth already includes the latency at that size, so no α is added on top."""
    if size is not None and getattr(link, "busbw_points", ()):
        return 0.0, link.bus_bandwidth(size)
    return link.at(n) if hasattr(link, "at") else link


def ring_all_reduce(size, n, link) -> float:
    _check(size, n)
    if n == 1:
        return 0.0
    alpha, bw = _ab(link, n, size)
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw


def tree_all_reduce(size, n, link) -> float:
    _check(size, n)
    if n == 1:
        return 0.0
    alpha, bw = _ab(link, n, size)
    return 2 * math.ceil(math.log2(n)) * alpha + 2 * size / bw


def all_gather(size, n, link) -> float:
    _check(size, n)
    if n == 1:
        return 0.0
    alpha, bw = _ab(link, n, size)
    return (n - 1) * alpha + (n - 1) / n * size / bw


reduce_scatter = all_gather  # the same traffic, reversed
all_to_all = all_gather  # nccl-tests: the same (n-1)/n bus-bandwidth factor; each rank holds `size` bytes


def p2p(size, link) -> float:
    _check(size, 2)
    alpha, bw = _ab(link, 2, size)
    return alpha + size / bw


def hierarchical_all_reduce(size, nodes, per_node, intra, inter) -> float:
    """Reduce-scatter inside each node, ring all-reduce of the 1/g shards between nodes, all-gather inside."""
    return (
        reduce_scatter(size, per_node, intra)
        + ring_all_reduce(size / per_node, nodes, inter)
        + all_gather(size, per_node, intra)
    )


def all_reduce(size, n, hardware, algorithm: str = "ring") -> float:
    """All-reduce over n ranks laid out node by node: one node -> ring/tree; several -> hierarchical."""
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")
    g = hardware.devices_per_node
    if n <= g:
        measured = hardware.intra.all_reduce_time(size, n) if n > 1 else None
        if measured is not None:  # a calibrated machine: its own curve beats the α-β line
            return measured
        return (ring_all_reduce if algorithm == "ring" else tree_all_reduce)(size, n, hardware.intra)
    if n % g:
        raise ValueError(f"{n} ranks do not fill whole nodes of {g}")
    return hierarchical_all_reduce(size, n // g, g, hardware.intra, hardware.inter)
