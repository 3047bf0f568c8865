"""Where each process group sits on the machine, and what its collectives cost there.

The rank grid is ``arange(world_size).view(dp, pp, tp)`` (Megatron-LM's and picotron's order: tensor-parallel
ranks adjacent, then pipeline stages, then replicas), and nodes hold ``devices_per_node`` consecutive ranks.
So a tensor-parallel group is ``tp`` neighbours (one node when tp divides the node), a pipeline boundary joins
ranks ``tp`` apart, and a data-parallel group takes every ``tp·pp``-th rank — it spans nodes as soon as
tp·pp ≥ the node size. Each group is priced on the links it crosses:

- inside one node: the intra-node link (NVLink/NVSwitch; the published nccl-tests curve where the preset has one);
- across nodes with one member per node: NCCL's faster of a ring and a double binary tree over the inter-node
  link (an all-reduce; in-network reduction where the fabric has it), each member on its own NIC (a DGX A100 has
  one HDR NIC per GPU; a fabric with fewer NICs shares them: ``between_nodes``);
- across nodes with k > 1 members per node: hierarchical — reduce-scatter inside each node, the 1/k shards
  all-reduced between nodes (k rings side by side, one per NIC), all-gather inside the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import collectives as cost  # the formulas (ring, all-gather, p2p, ...)
from .strategy import expert_grid_folds_tp


@dataclass(frozen=True)
class Placement:
    """How one group of ``size`` ranks lies on the nodes: ``per_node`` members share a node, over ``nodes``."""

    kind: str
    size: int
    per_node: int
    nodes: int

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


def group_ranks(strategy, kind: str, index: int = 0) -> list[int]:
    """Global ranks of the ``index``-th member set of a group of the grid view(dp, pp, cp, tp): "tp", "cp",
    "pp", "dp", "dp_cp" (the dp × cp ranks that average dense gradients), "ep" (ep consecutive ranks of those,
    cp first: ``simlib.parallel.mesh``'s order; of the tp × cp × dp ranks under Megatron's order) or "expert_dp"
    (the ranks holding the same experts).

    Group 0 of each kind starts at rank 0 (every group of a kind has the same shape on whole nodes)."""
    s = strategy
    cp = getattr(s, "cp", 1)
    outer = getattr(s, "pipeline_outer", False)  # Megatron's order: view(pp, dp, cp, tp)
    dp_stride = s.tp * cp * (1 if outer else s.pp)
    tokens = [index + d * dp_stride + c * s.tp for d in range(s.dp) for c in range(cp)]  # dp_cp order
    if kind == "dp_cp":
        return tokens
    if kind in ("ep", "expert_dp"):
        ep = getattr(s, "ep", 1)
        if expert_grid_folds_tp(s):
            # Megatron-Core's expert grid (MoE parallel folding, expert tensor parallelism 1: the experts whole,
            # as layer.py prices them): a stage's tp × cp × dp ranks re-split as ep × expert-dp, ep fastest, so an
            # expert group is ep consecutive ranks (inside a node when ep <= its devices) whatever tp is
            # (megatron/core/parallel_state.py: the expert RankGenerator with tp=etp, order tp-ep-dp-pp)
            tokens = sorted(t + r for t in tokens for r in range(s.tp))
        return tokens[:ep] if kind == "ep" else tokens[::ep]
    stride = {"tp": 1, "cp": s.tp, "pp": s.tp * cp * (s.dp if outer else 1), "dp": dp_stride}.get(kind)
    if stride is None:
        raise ValueError(f"group kind must be tp, cp, pp, dp, dp_cp, ep or expert_dp, got {kind!r}")
    size = {"tp": s.tp, "cp": cp, "pp": s.pp, "dp": s.dp}[kind]
    return [index + i * stride for i in range(size)]


def placement(strategy, hardware, kind: str) -> Placement:
    """The nodes a group of the rank grid spans, and how many of its members share each node."""
    ranks = group_ranks(strategy, kind)
    g = hardware.devices_per_node
    counts: dict[int, int] = {}
    for r in ranks:
        counts[r // g] = counts.get(r // g, 0) + 1
    return Placement(kind, len(ranks), max(counts.values()), len(counts))


def _ring(kind, size, n, link):
    if kind == "all_reduce":
        return cost.ring_all_reduce(size, n, link)
    return cost.all_gather(size, n, link)  # all-gather and reduce-scatter move the same bytes


def fabric_link(hardware):
    """The inter-node link as one device sees it while every device of its node talks: ``inter`` with its
    bandwidth × :meth:`~simlib.sim.hardware.Hardware.nic_share` (fewer NICs than devices share them)."""
    from dataclasses import replace

    share = hardware.nic_share()
    if share == 1.0:
        return hardware.inter
    alpha, bw = hardware.inter.at(2)
    return replace(hardware.inter, alpha=alpha, bandwidth=bw * share, by_world={}, busbw_points=())


def between_nodes(kind: str, size: float, nodes: int, hardware) -> float:
    """A collective of ``size`` bytes between ``nodes`` nodes, one member each (or one of k rings side by side).

    All-reduce: with in-network reduction (``hardware.in_network_reduction``, SHARP) the switches reduce: each
    byte goes up and comes down once, through ⌈log_radix nodes⌉ switch levels (2·levels·α + S/B); else NCCL's
    choice of the faster of its ring (2(n−1)·α + 2(n−1)/n·S/B) and its double binary tree
    (2·⌈log2 n⌉·α + 2·S/B): at thousands of nodes the ring's latency grows with n, the tree's with log n.
    All-gather / reduce-scatter: the ring. Rings and trees laid out pod by pod cross a pod's tapered uplinks on
    few of their hops, so oversubscription is not charged to them (it is to the all-to-all: ``group_collective``).
    """
    import math

    link = fabric_link(hardware)
    if kind != "all_reduce":
        return cost.all_gather(size, nodes, link)
    if nodes == 1:
        return 0.0
    if hardware.in_network_reduction:
        from .hardware import SWITCH_RADIX

        alpha, bw = cost._ab(link, nodes, size)
        levels = max(1, math.ceil(math.log(nodes) / math.log(SWITCH_RADIX)))
        return 2 * levels * alpha + size / bw
    return min(cost.ring_all_reduce(size, nodes, link), cost.tree_all_reduce(size, nodes, link))


def cross_pod_factor(nodes: int, hardware) -> float:
    """How much longer uniform all-to-all traffic between ``nodes`` nodes takes on a tapered fabric: the share x
    of each node's peers outside its pod (``nodes_per_pod``) crosses uplinks with 1/``oversubscription`` of the
    pod's NIC bandwidth, so the pod's uplinks need x·oversubscription of the time the NICs need (1 if less)."""
    pod = hardware.nodes_per_pod
    if not pod or nodes <= pod or hardware.oversubscription <= 1:
        return 1.0
    x = (nodes - pod) / (nodes - 1)
    return max(1.0, x * hardware.oversubscription)


def remote_copy_share(experts: int, top_k: int, nodes: int) -> float:
    """Of a token's top-k copies that go to experts on other nodes, the share a deduplicating dispatcher (DeepEP,
    HybridEP) still sends over the NICs: it sends the token once to each remote node holding any of its experts
    and forwards it over NVLink there. With the experts spread evenly over ``nodes`` nodes and the top-k drawn
    without replacement (balanced routing), a given node holds none of a token's experts with probability
    C(E − E/nodes, k) / C(E, k); the remote nodes reached are (nodes − 1)(1 − that), the remote copies
    k (nodes − 1)/nodes. Qwen3-235B (128 experts, top 8) over 4 nodes: 0.45; DeepSeek-V3 (256, top 8) over 8: 0.66.
    """
    if nodes <= 1 or top_k <= 1:
        return 1.0
    per_node = experts / nodes
    none_here = 1.0
    for i in range(top_k):
        none_here *= max(experts - per_node - i, 0.0) / (experts - i)
    return min(1.0, nodes * (1.0 - none_here) / top_k)


def group_collective(kind: str, size: float, place: Placement, hardware, remote_share: float = 1.0) -> float:
    """Seconds of an all-reduce / reduce-scatter / all-gather of ``size`` bytes (the full tensor) over a group
    placed as ``place``: intra-node ring, inter-node ring (one member per node), or hierarchical.

    ``all_to_all`` (``size``: one rank's buffer): each rank sends (k−1)/n of it over the node's links and
    (n−k)/n over its own NIC at the same time, so the slower share sets the time (α: n−1 steps).
    ``p2p``: one message of ``size`` to a neighbour of the group (a ring's hop: over the NIC as soon as the group
    spans nodes, since the ring steps in lockstep).

    ``remote_share`` (all-to-all only): the share of the out-of-node bytes that cross the NICs (a deduplicating
    expert dispatcher: :func:`remote_copy_share`)."""
    if kind not in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "p2p"):
        raise ValueError(f"collective must be all_reduce, reduce_scatter, all_gather, all_to_all or p2p, got {kind!r}")
    n, k, nodes = place.size, place.per_node, place.nodes
    if n == 1:
        return 0.0
    if kind == "p2p":
        return cost.p2p(size, hardware.intra if nodes == 1 else fabric_link(hardware))
    if kind == "all_to_all":
        if nodes == 1:
            return cost.all_to_all(size, n, hardware.intra)
        a_in, b_in = cost._ab(hardware.intra, k, size * (k - 1) / n) if k > 1 else (0.0, 1.0)
        a_out, b_out = cost._ab(fabric_link(hardware), nodes, size * (n - k) / n * remote_share)
        out = size * (n - k) / n * remote_share / b_out * cross_pod_factor(nodes, hardware)
        return (k - 1) * a_in + (n - k) * a_out + max(size * (k - 1) / n / b_in, out)
    if nodes == 1:
        if kind == "all_reduce":
            return cost.all_reduce(size, n, hardware)  # the calibrated curve where measured, else the ring
        return _ring(kind, size, n, hardware.intra)
    if k == 1:
        return between_nodes(kind, size, nodes, hardware)
    inside = cost.reduce_scatter(size, k, hardware.intra)  # = all_gather(size, k, intra)
    between = between_nodes(kind, size / k, nodes, hardware)  # k rings (or trees) side by side, a NIC each
    if kind == "all_reduce":
        return inside + between + inside
    return inside + between


def p2p_time(size: float, strategy, hardware) -> float:
    """One pipeline message of ``size`` bytes (the whole activation of a micro-batch) between adjacent stages.

    As Megatron-LM does (Narayanan et al. 2021 §4.1, scatter/gather), each of the tp ranks of a stage sends
    1/tp of the tensor to its peer in the next stage, and the receiving stage all-gathers it inside its node.
    The send crosses NVLink when the neighbours share a node (tp·pp within a node), else InfiniBand (one NIC
    per GPU); if any boundary of the grid crosses nodes, that slowest boundary sets the pace."""
    s = strategy
    if s.pp == 1:
        return 0.0
    link = hardware.intra if same_node(s, hardware) else fabric_link(hardware)
    gather = cost.all_gather(size, s.tp, hardware.intra) if s.tp > 1 else 0.0
    return cost.p2p(size / s.tp, link) + gather


def same_node(strategy, hardware) -> bool:
    """Do all pipeline neighbours (ranks tp apart, in every replica) share a node?"""
    g, s = hardware.devices_per_node, strategy
    step = s.tp * getattr(s, "cp", 1)  # pipeline neighbours are tp × cp ranks apart (× dp in Megatron's order)
    if getattr(s, "pipeline_outer", False):
        return all(
            r // g == (r + step * s.dp) // g
            for p in range(s.pp - 1)
            for d in range(s.dp)
            for r in [(p * s.dp + d) * step]
        )
    return all(r // g == (r + step) // g for d in range(s.dp) for p in range(s.pp - 1) for r in [(d * s.pp + p) * step])
