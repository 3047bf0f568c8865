"""What a collective costs on a box whose ranks share the cores, where :func:`simlib.sim.calibrate` measured it.

On a CPU box the ranks time-slice the cores: a blocking call waits for its peers to be scheduled, and a ring pass
started before compute takes that compute's core for its copies. ``calibrate(kernels=True)`` measures what such
calls add to the compute around them (``Hardware.overheads["kernels"]``: ``in_situ``, ``sync``, ``a2a``); these
functions read those measurements and fall back on the link's α-β on a preset. Lesson 09's cost model
(:mod:`simlib.sim.context_experts`) prices its layers with them, and the operator model of a whole GPT
(:func:`simlib.sim.cost.gpt_stage`) prices simlib's ring attention with the same ones (:func:`ring_exposed`).
"""

from __future__ import annotations

from .cluster_ops import attention_time
from .collectives import _ab, all_gather, all_to_all, p2p


def _measured(hardware, processes) -> dict:
    """What calibrate(kernels=True) measured on this box for ``processes`` ranks (``overheads["kernels"]``); {}
    on a preset."""
    return (hardware._by_world("kernels", processes, None) if hasattr(hardware, "_by_world") else None) or {}


def _p2p(nbytes, hardware):
    """One point-to-point message: the ping-pong fit where measured, else the link's α-β."""
    link = hardware.p2p_link() if hasattr(hardware, "p2p_link") else None
    return link[0] + nbytes / link[1] if link else p2p(nbytes, hardware.intra)


def _sync(hardware, processes):
    """Seconds a blocking collective waits for its peers after a stretch of work, where calibrate() measured it
    (``kernels["sync"]``: on a box whose cores the ranks share, far more than the back-to-back α); else None."""
    return _measured(hardware, processes).get("sync") if processes > 1 else None


def all_to_all_time(nbytes, n, hardware, processes=None):
    """One all-to-all of ``nbytes`` per rank, back to back: Gloo's own measured (α, B) where calibrate() fitted
    it (``kernels["a2a"]``, α + bytes / B over a rank's input), else the link's α-β with the (n−1)/n factor."""
    if n <= 1:
        return 0.0
    fit = _measured(hardware, processes or n).get("a2a")
    return fit[0] + nbytes / fit[1] if fit else all_to_all(nbytes, n, hardware.intra)


def _in_situ(hardware, processes, kind, group=None):
    """(α, B) of what a call of ``kind`` adds to the compute it meets, where calibrate() measured it
    (``kernels["in_situ"]``, :func:`simlib.sim.kernels.in_situ_comm`: a2a, hop, hop_overlapped, all_reduce), else
    None. ``group``: ranks in the call, when fewer than the ``processes`` sharing the box — then the measurement of
    groups of that size side by side (``kernels["in_situ_groups"]``) where there is one."""
    table = _measured(hardware, processes)
    if group and group < processes:
        side = (table.get("in_situ_groups") or {}).get(group)
        if side and kind in side:
            return side[kind]
    return (table.get("in_situ") or {}).get(kind)


def in_situ_all_reduce(nbytes, n, hardware, processes):
    """Seconds an all-reduce of ``nbytes`` over ``n`` of the ``processes`` ranks sharing a box adds after compute,
    where calibrate(kernels=True) measured it (the course's tensor-parallel all-reduces); None elsewhere."""
    fit = _in_situ(hardware, processes, "all_reduce", n) if n > 1 else None
    return fit[0] + nbytes / fit[1] if fit else None


def _blocking(nbytes, n, hardware, kind="all_to_all", processes=None):
    """One collective every rank waits on (``kind``: all_to_all, all_gather or p2p) of ``nbytes`` per rank: what
    it adds to the compute around it where calibrate() measured that (:func:`_in_situ`); else its α-β time, with
    the latency taken as the measured in-situ wait (:func:`_sync`) where there is one."""
    if n <= 1:
        return 0.0
    fit = _in_situ(hardware, processes or n, {"all_to_all": "a2a", "p2p": "hop"}.get(kind), n)
    if fit:
        return fit[0] + nbytes / fit[1]
    if kind == "p2p":
        t, alpha = (
            _p2p(nbytes, hardware),
            ((hardware.p2p_link() if hasattr(hardware, "p2p_link") else None) or _ab(hardware.intra, 2, nbytes))[0],
        )
    elif kind == "all_to_all":
        t = all_to_all_time(nbytes, n, hardware, processes)
        alpha = (_measured(hardware, processes or n).get("a2a") or ((n - 1) * _ab(hardware.intra, n, nbytes)[0],))[0]
    else:  # all_gather, priced on the gathered size
        t = all_gather(nbytes * n, n, hardware.intra)
        alpha = (n - 1) * _ab(hardware.intra, n, nbytes * n)[0]
    wait = _sync(hardware, processes or n)
    return t if wait is None else max(t - alpha, 0.0) + wait


def _in_step(nbytes, n, hardware, processes=None):
    """An all-to-all right after another collective: where calibrate() measured calls after compute, such a call
    finds the ranks in step and costs what one after a barrier does (:func:`all_to_all_time`); else as any
    blocking one (:func:`_blocking`)."""
    if n > 1 and _in_situ(hardware, processes or n, "a2a"):
        return all_to_all_time(nbytes, n, hardware, processes)
    return _blocking(nbytes, n, hardware, "all_to_all", processes)


def _small_collective(n, hardware, processes=None):
    """The shape check both attentions start with (an all-gather of 4 int64 per rank): latency only."""
    return _blocking(32, n, hardware, "all_gather", processes)


def exposed_hop(kv_bytes, cp, hardware, processes, compute) -> float:
    """Seconds one ring pass of a K/V block (``kv_bytes``), started before a ring step's compute and waited for
    after it, adds to that step: what calibrate() measured such a pass add (``in_situ["hop_overlapped"]``: where
    the ranks share cores the copies take the compute's core, so overlapping hides nothing), else what the
    pass takes beyond the step's compute (``compute`` / cp) plus the wait for the peers."""
    overlapped = _in_situ(hardware, processes, "hop_overlapped", cp)
    if overlapped:
        return overlapped[0] + kv_bytes / overlapped[1]
    return max(0.0, _p2p(kv_bytes, hardware) - compute / cp) + _blocking(0, cp, hardware, "p2p", processes)


def ring_exposed(ops, times, hardware, processes):
    """Seconds simlib's ring attention's passes (the "cp" ring ops of :func:`simlib.sim.cluster_ops.cp_ops` in
    ``ops``, their times in ``times``) add to a layer's compute, counted as :class:`simlib.parallel.context.
    RingAttention` runs them, where calibrate() measured passes in situ; None elsewhere (a GPU preset: the ring
    of Transformer Engine, priced by :func:`simlib.sim.cluster_ops.exposed_comm`).

    Forward: cp − 1 overlapped K/V passes and the shape check's small all-gather. Backward: cp − 1 overlapped
    K/V passes and cp dK/dV passes waited for at once (:func:`_blocking`). As lesson 09's
    :func:`~simlib.sim.context_experts.ring_attention_time`."""
    if not _in_situ(hardware, processes, "hop"):
        return None
    attention = attention_time(ops, times)
    out = 0.0
    for op in ops:
        if op.kind != "comm" or op.group != "cp":
            continue
        cp = op.count + 1
        if "dK" in op.name:  # backward: K/V again, and each step's dK/dV
            kv = op.bytes / (2 * op.count)
            out += op.count * exposed_hop(kv, cp, hardware, processes, attention) + cp * _blocking(
                kv, cp, hardware, "p2p", processes
            )
        else:
            kv = op.bytes / op.count
            out += op.count * exposed_hop(kv, cp, hardware, processes, attention) + _small_collective(
                cp, hardware, processes
            )
    return out
