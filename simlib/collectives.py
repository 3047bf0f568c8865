"""Collectives from point-to-point messages, and how fast they run here.

Ring all-reduce (Patarasuk & Yuan 2009; the algorithm behind Baidu's ring all-reduce and NCCL's ring) is
two phases over a ring of ``world_size`` ranks, each ``world_size - 1`` steps of "send one chunk to the
right neighbour, receive one from the left":

    reduce-scatter: after it, rank r holds the full sum of chunk (r + 1) % n
    all-gather:     every rank passes its finished chunk around until everyone has all n

Each rank sends 2(n-1)/n of the tensor in all, whatever n is: that is why the ring is bandwidth-optimal,
and why the alpha-beta model of its time is ``2(n-1)·alpha + 2(n-1)/n · S · beta``.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algorithm bandwidth S/t times 2(n-1)/n for
all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast and reduce; it is comparable
across world sizes and with the link's speed.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "ring_neighbors",
    "sendrecv",
    "chunk_bounds",
    "ring_chunks",
    "ring_reduce_scatter_",
    "ring_all_gather_",
    "ring_all_reduce",
    "bus_factor",
    "bandwidth_sweep",
    "fit_alpha_beta",
    "alpha_beta_time",
    "collective_demo",
    "COLLECTIVES",
]


# ───────────────────────── point to point ─────────────────────────


def ring_neighbors(rank: int, world_size: int) -> tuple[int, int]:
    """(left, right): the rank we receive from and the rank we send to on the ring."""
    return (rank - 1) % world_size, (rank + 1) % world_size


def sendrecv(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
    """Send ``send_buf`` to ``dst`` while receiving ``recv_buf`` from ``src``.

    Both are posted before either is waited on: with a blocking ``send`` first on every rank, each rank
    would wait for a receiver that is itself still sending (a deadlock once messages outgrow the
    transport's buffers).
    """
    if send_buf.numel() == 0 and recv_buf.numel() == 0:
        return  # both sides know the chunk is empty: nothing to exchange
    works = []
    if send_buf.numel():
        works.append(dist.isend(send_buf, dst))
    if recv_buf.numel():
        works.append(dist.irecv(recv_buf, src))
    for work in works:
        work.wait()


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks (start, end).

    The first ``numel % world_size`` chunks get one extra element (as ``torch.tensor_split``), so any
    length works; chunks may be empty when ``numel < world_size``.
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


# ───────────────────────── ring all-reduce ─────────────────────────


def ring_chunks(phase: str, rank: int, world_size: int, step: int) -> tuple[int, int]:
    """(chunk rank sends right, chunk it receives from the left) at ``step`` of a ring phase.

    reduce_scatter: send (r - s) mod n, add the received partial sum into (r - s - 1) mod n;
    all_gather: send the finished (r + 1 - s) mod n, receive the finished (r - s) mod n.
    (Pure: ``simlib.widgets.ring_trace`` steps the same indices to draw the ring.)
    """
    n = world_size
    if phase == "reduce_scatter":
        return (rank - step) % n, (rank - step - 1) % n
    if phase == "all_gather":
        return (rank + 1 - step) % n, (rank - step) % n
    raise ValueError(f"phase must be 'reduce_scatter' or 'all_gather', got {phase!r}")


def ring_reduce_scatter_(flat: torch.Tensor, group=None) -> int:
    """Phase 1, in place on a 1-D tensor: return the index of the chunk this rank now holds summed."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    left, right = ring_neighbors(rank, world_size)
    left, right = _global(left, group), _global(right, group)
    bounds = chunk_bounds(flat.numel(), world_size)
    recv = torch.empty(max(e - s for s, e in bounds), dtype=flat.dtype, device=flat.device)
    for step in range(world_size - 1):
        send, recv_chunk = ring_chunks("reduce_scatter", rank, world_size, step)
        s_lo, s_hi = bounds[send]  # the partial sum we pass on
        r_lo, r_hi = bounds[recv_chunk]  # the one we add our part to
        buf = recv[: r_hi - r_lo]
        sendrecv(flat[s_lo:s_hi], right, buf, left)
        flat[r_lo:r_hi] += buf
    return (rank + 1) % world_size


def ring_all_gather_(flat: torch.Tensor, group=None) -> None:
    """Phase 2, in place: rank r starts with chunk (r + 1) % n complete; afterwards every rank has all."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    left, right = ring_neighbors(rank, world_size)
    left, right = _global(left, group), _global(right, group)
    bounds = chunk_bounds(flat.numel(), world_size)
    for step in range(world_size - 1):
        send, recv_chunk = ring_chunks("all_gather", rank, world_size, step)
        s_lo, s_hi = bounds[send]  # a finished chunk we pass on
        r_lo, r_hi = bounds[recv_chunk]  # a finished chunk we receive
        sendrecv(flat[s_lo:s_hi], right, flat[r_lo:r_hi], left)


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """All-reduce ``tensor`` in place with send/recv only (``op``: "sum" or "avg"); returns it.

    Equal to ``dist.all_reduce(tensor)`` up to floating-point summation order.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):  # check before touching data
        raise ValueError(
            f"op='avg' needs a floating-point tensor, got {tensor.dtype} (an integer mean would be "
            "truncated): convert first, e.g. t = t.float(), or use op='sum'"
        )
    world_size = dist.get_world_size(group)
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = work.view(-1)
    if world_size > 1:
        ring_reduce_scatter_(flat, group)
        ring_all_gather_(flat, group)
    if op == "avg":
        flat /= world_size
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def _global(group_rank: int, group) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


# ───────────────────────── what each collective does ─────────────────────────

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")


def collective_demo(op: str, numel: int | None = None) -> dict:
    """Run one collective on a small tensor; return what this rank held before and after (as lists).

    Rank r starts with ``[10r, 10r + 1, ...]`` so each number says where it came from. Run it on every
    rank (``cluster.run(collective_demo, "all_reduce")``).
    """
    from .env import device

    rank, world_size = dist.get_rank(), dist.get_world_size()
    numel = world_size if numel is None else numel
    x = torch.arange(numel, dtype=torch.float32, device=device()) + 10 * rank
    before = x.tolist()
    if op == "broadcast":
        dist.broadcast(x, src=0)
        after = x
    elif op == "reduce":
        dist.reduce(x, dst=0)  # only rank 0's result is defined; the others keep scratch values
        after = x if rank == 0 else None
    elif op == "all_reduce":
        dist.all_reduce(x)
        after = x
    elif op == "all_gather":
        parts = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(parts, x)
        after = torch.cat(parts)
    elif op == "reduce_scatter":
        if numel % world_size:
            raise ValueError("reduce_scatter needs numel divisible by world_size")
        after = torch.empty(numel // world_size, device=x.device)
        dist.reduce_scatter(after, list(x.chunk(world_size)))  # Gloo: emulated (see notebook 01)
    else:
        raise ValueError(f"unknown collective {op!r}: use one of {COLLECTIVES}")
    return dict(rank=rank, op=op, before=before, after=None if after is None else after.tolist())


# ───────────────────────── bandwidth ─────────────────────────


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth."""
    n = world_size
    if op in ("all_reduce", "ring_all_reduce"):
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) / n
    return 1.0


def _runner(op: str, x: torch.Tensor):
    world_size = dist.get_world_size()
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "ring_all_reduce":
        return lambda: ring_all_reduce(x)
    if op == "all_gather":  # S = the gathered size, as in nccl-tests
        part, out = (
            x[: x.numel() // world_size],
            [torch.empty_like(x[: x.numel() // world_size]) for _ in range(world_size)],
        )
        return lambda: dist.all_gather(out, part)
    if op == "reduce_scatter":
        out, ins = torch.empty_like(x[: x.numel() // world_size]), list(x.chunk(world_size))
        return lambda: dist.reduce_scatter(out, ins)
    raise ValueError(f"unknown op {op!r}")


def bandwidth_sweep(
    sizes_bytes, ops=("all_reduce", "ring_all_reduce"), repeats: int = 10, warmup: int = 2
) -> list[dict]:
    """Time each op at each message size on every rank (call it on every rank); float32 tensors.

    Every timed call starts after a barrier, so the ranks start together; the slowest rank's time is
    the collective's time (max over ranks), and the median over ``repeats`` is reported with the
    quartiles. Returns rows: op, world_size, bytes, time (s), time_q1, time_q3, algbw, busbw (bytes/s).
    """
    from .env import device, synchronize

    world_size, dev = dist.get_world_size(), device()
    rows = []
    for op in ops:
        for size in sizes_bytes:
            numel = max(world_size, int(size) // 4 // world_size * world_size)
            x = torch.ones(numel, device=dev)
            run = _runner(op, x)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                t0 = time.perf_counter()
                run()
                synchronize(dev)  # on a GPU the call only queues the work
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i >= warmup:
                    times.append(float(elapsed))
            t, (q1, q3) = float(np.median(times)), (float(q) for q in np.percentile(times, [25, 75]))
            nbytes = numel * 4
            rows.append(
                dict(
                    op=op,
                    world_size=world_size,
                    bytes=nbytes,
                    time=t,
                    time_q1=q1,
                    time_q3=q3,
                    algbw=nbytes / t,
                    busbw=nbytes / t * bus_factor(op, world_size),
                )
            )
    return rows


def alpha_beta_time(size_bytes, world_size: int, alpha: float, beta: float):
    """Ring all-reduce time in the alpha-beta model: 2(n-1)·alpha + 2(n-1)/n·S·beta (seconds)."""
    n = world_size
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * np.asarray(size_bytes, dtype=float) * beta


def fit_alpha_beta(size_bytes, times, world_size: int) -> dict:
    """Fit latency ``alpha`` (s per message) and ``beta`` (s per byte) of the ring model to measurements.

    Least squares on relative error (each row divided by its time), so 1 KB and 64 MB points count
    alike; returns alpha, beta, the implied link bandwidth 1/beta (bytes/s) and the median relative error.
    """
    s = np.asarray(size_bytes, dtype=float)
    t = np.asarray(times, dtype=float)
    n = world_size
    design = np.stack([np.full_like(s, 2 * (n - 1)), 2 * (n - 1) / n * s], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 1e-15)
    err = np.abs(alpha_beta_time(s, n, alpha, beta) - t) / t
    return dict(alpha=alpha, beta=beta, bandwidth=1.0 / beta, median_rel_error=float(np.median(err)))
