"""All-to-all: every rank sends a different slice of a tensor to every other rank (and keeps its own).

The collective behind Ulysses context parallelism (sequence-sharded -> head-sharded and back) and expert
parallelism (tokens to the ranks that hold their experts, and back). Rank ``r`` cuts its input along dim 0
into ``in_splits`` pieces; piece ``j`` goes to rank ``j``; the output is the pieces received, in rank order.
Each rank sends (n-1)/n of an evenly split input: the bus-bandwidth factor nccl-tests uses for all-to-all.

Two engines with one interface: ``"native"`` is ``dist.all_to_all_single`` (Gloo implements it as an
alltoallv); ``"p2p"`` builds it from ``batch_isend_irecv``, one send and one recv per peer — the way to
see what the collective does, and the fallback on a backend without it. ``AllToAll`` is the autograd
function: its backward is the all-to-all with the splits swapped. Every call is recorded in a
:class:`simlib.parallel.comm_log.CommLog` (the bytes sent to other ranks, seconds).
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from .comm_log import CommLog


def group_rank_size(group=None) -> tuple[int, int]:
    """(rank, size) in ``group``; (0, 1) when no process group is running (one process)."""
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def peer(group, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (what send/recv need)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def all_to_all(
    x: torch.Tensor,
    in_splits: list[int],
    out_splits: list[int],
    group=None,
    log: CommLog | None = None,
    name: str = "all-to-all",
    engine: str = "native",
) -> torch.Tensor:
    """Send ``x``'s dim-0 pieces ``in_splits`` to ranks 0..n-1; receive ``out_splits`` rows from each."""
    rank, n = group_rank_size(group)
    if len(in_splits) != n or len(out_splits) != n:
        raise ValueError(
            f"rank {rank}: all_to_all needs one split per rank ({n}), got {len(in_splits)} to send "
            f"and {len(out_splits)} to receive"
        )
    if sum(in_splits) != x.shape[0]:
        raise ValueError(
            f"rank {rank}: the splits to send add up to {sum(in_splits)} rows but the tensor has "
            f"{x.shape[0]}; split along dim 0"
        )
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    row = math.prod(x.shape[1:]) * x.element_size()
    start = time.perf_counter()
    if n == 1:
        out.copy_(x)
    elif engine == "native":
        dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=group)
    elif engine == "p2p":
        sends, recvs = torch.split(x, list(in_splits)), torch.split(out, list(out_splits))
        ops = []
        for j in range(1, n):  # peers in ring order from this rank: no two ranks wait on the same one
            to, frm = (rank + j) % n, (rank - j) % n
            if in_splits[to]:
                ops.append(dist.P2POp(dist.isend, sends[to].contiguous(), peer(group, to), group))
            if out_splits[frm]:
                ops.append(dist.P2POp(dist.irecv, recvs[frm], peer(group, frm), group))
        recvs[rank].copy_(sends[rank])
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
    else:
        raise ValueError(f"engine must be 'native' (dist.all_to_all_single) or 'p2p' (send/recv), got {engine!r}")
    if log is not None:
        log.add(name, (sum(in_splits) - in_splits[rank]) * row, time.perf_counter() - start)
    return out


class AllToAll(torch.autograd.Function):
    """All-to-all in forward; in backward the gradients travel back: the same collective, splits swapped."""

    @staticmethod
    def forward(ctx, x, in_splits, out_splits, group=None, log=None, name="all-to-all", engine="native"):
        ctx.args = (in_splits, out_splits, group, log, name, engine)
        return all_to_all(x, in_splits, out_splits, group, log, name, engine)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits, group, log, name, engine = ctx.args
        grad_x = all_to_all(grad, out_splits, in_splits, group, log, f"{name} (backward)", engine)
        return grad_x, None, None, None, None, None, None


def exchange_counts(counts: torch.Tensor, group=None) -> torch.Tensor:
    """Each rank's ``counts[j]`` (rows it will send to rank j) -> the rows it will receive from each rank."""
    rank, n = group_rank_size(group)
    counts = counts.to(torch.int64).contiguous()
    if n == 1:
        return counts.clone()
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts, group=group)
    return out


def volume(elements_per_rank: int, world_size: int, bytes_per_element: int = 4) -> int:
    """Bytes each rank sends in an all-to-all of ``elements_per_rank`` values split evenly: (n-1)/n of them."""
    return elements_per_rank * bytes_per_element * (world_size - 1) // world_size
