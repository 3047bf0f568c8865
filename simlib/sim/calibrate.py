"""Measure this machine: GEMM throughput per (processes, threads) and GEMM size, memory bandwidth, Gloo α and β.

Every number is measured while the given number of processes run *at the same time*, because on a small box
they share cores and memory: two 1-thread processes each get less than one alone (course notes: 51 vs 58
GFLOP/s). One warm :class:`simlib.Cluster` serves every world size: the first ``world_size`` ranks form a
sub-group and measure, the others wait.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

# (m, k, n) of the GEMMs we time: squares and the skinny (batch × width × width) shapes of MLP layers
# (m, k, n) of the GEMMs we time: the shapes of the course's MLP layers, forward / grad-input (batch × width ×
# width) and grad-weight (width × batch × width), for widths 512 and 1024, plus one large square
GEMM_SHAPES = ([(m, w, w) for w in (512, 1024) for m in (16, 64, 256)]
               + [(w, m, w) for w in (512, 1024) for m in (16, 64, 256)] + [(1024, 1024, 1024)])
COMM_SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes of one all-reduce
_GROUPS: dict = {}


def subgroup(world_size: int):
    """The process group of ranks 0..world_size-1 (made once; every rank of the cluster must ask)."""
    import torch.distributed as dist

    if world_size == dist.get_world_size():
        return None  # the default group
    if world_size not in _GROUPS:
        _GROUPS[world_size] = dist.new_group(list(range(world_size)))
    return _GROUPS[world_size]


def _median_time(fn, repeats: int, min_time: float = 0.0) -> float:
    fn()  # warm-up
    times = []
    while len(times) < repeats or sum(times) < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) > 50 * repeats:
            break
    return float(np.median(times))


def measure_here(world_size: int, threads: int, gemm_shapes=GEMM_SHAPES, comm_sizes=COMM_SIZES,
                 repeats: int = 5, comm_repeats: int = 10, min_time: float = 0.2):
    """Run on every rank of a cluster: ranks < ``world_size`` measure together; the rest return None."""
    import torch
    import torch.distributed as dist

    group = subgroup(world_size)
    rank = dist.get_rank()
    if rank >= world_size:
        return None
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if world_size > 1:
            dist.barrier(group=group)
        gemms = []
        for m, k, n in gemm_shapes:
            a, b = torch.randn(m, k), torch.randn(k, n)
            if world_size > 1:
                dist.barrier(group=group)  # every rank times the same shape at the same time
            # time each shape for a while: a short burst right after a barrier gets more than its share
            # of a busy CPU (the scheduler favours a task that just slept), a training step does not
            t = _median_time(lambda: a @ b, repeats, min_time=min_time)
            gemms.append((2 * m * k * n / 1e9, 2 * m * k * n / t))
        x, y = torch.randn(32 << 20), torch.randn(32 << 20)  # 128 MB each: far bigger than any cache
        mem_bw = 3 * x.numel() * 4 / _median_time(lambda: x.add_(y), repeats)
        x = y = None  # free the 256 MB now
        comm = []
        if world_size > 1:
            for size in comm_sizes:
                buf = torch.zeros(size // 4)
                dist.barrier(group=group)
                t = _median_time(lambda: dist.all_reduce(buf, group=group), comm_repeats)
                comm.append((size, t))
        return {"gemms": gemms, "mem_bw": mem_bw, "comm": comm}
    finally:
        torch.set_num_threads(old_threads)


def _combine(results):
    """Ranks measured side by side: a GEMM's rate is the mean over ranks, a collective's time the slowest."""
    res = [r for r in results if r is not None]
    gemms = [(res[0]["gemms"][i][0], float(np.mean([r["gemms"][i][1] for r in res])))
             for i in range(len(res[0]["gemms"]))]
    comm = [(res[0]["comm"][i][0], max(r["comm"][i][1] for r in res)) for i in range(len(res[0]["comm"]))]
    return gemms, float(np.mean([r["mem_bw"] for r in res])), comm


def calibrate(cluster=None, world_sizes=(1, 2, 4), repeats: int | None = None, timeout: float = 120.0,
              min_time: float | None = None):
    """Measure this machine and return a :class:`~simlib.sim.hardware.Hardware` for it.

    Measures, for each world size w (w processes running at once, cores // w threads each — the default of
    :class:`simlib.Cluster` — and for w = 1 also every thread count up to the cores): GEMM FLOP/s against GEMM
    size, memory bandwidth (``x.add_(y)``), and a ring fit of Gloo all-reduce times (α per step, bus bandwidth).
    ``cluster``: a warm cluster with at least ``max(world_sizes)`` ranks (one is started and closed if None).
    """
    from .. import env
    from ..launch import Cluster, OversubscribedWarning
    from .hardware import Hardware, Link, fit_alpha_beta

    world_sizes = sorted(set(int(w) for w in world_sizes))
    if not world_sizes or world_sizes[0] < 1:
        raise ValueError(f"world_sizes must be positive ints, got {world_sizes}")
    repeats = repeats or (3 if env.quick() else 7)
    min_time = min_time if min_time is not None else (0.05 if env.quick() else 0.25)  # seconds per GEMM shape
    own = cluster is None
    if own:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscribedWarning)
            cluster = Cluster(max(world_sizes), call_timeout=timeout)
    elif cluster.world_size < max(world_sizes):
        raise ValueError(f"a cluster of {cluster.world_size} ranks cannot measure world size {max(world_sizes)}")
    cores = env.cpu_count()
    try:
        gemm_table, mem, links, curves, raw = {}, {}, {}, {}, {}
        for w in world_sizes:
            thread_counts = range(1, cores + 1) if w == 1 else [max(1, cores // w)]
            for threads in thread_counts:
                out = cluster.call(measure_here, (w, threads), {"repeats": repeats, "min_time": min_time},
                                   timeout=timeout)
                gemms, mem_bw, comm = _combine(out)
                gemm_table[(w, threads)] = gemms
                raw[(w, threads)] = {"gemms": gemms, "mem_bw": mem_bw, "comm": comm}
                if threads == max(1, cores // w):
                    mem[w] = mem_bw
                if comm:
                    alpha, bw = fit_alpha_beta([c[0] for c in comm], [c[1] for c in comm], w)
                    links[w] = (alpha, bw)
                    curves[w] = comm
    finally:
        if own:
            cluster.close()
    default = links.get(2) or next(iter(links.values()), (1e-3, 1e9))
    return Hardware(
        name=f"this machine ({cores} cores, calibrated)", peak_flops={}, memory_bytes=_ram_bytes(),
        memory_bandwidth=mem, intra=Link(default[0], default[1], links, "calibrate(): Gloo all-reduce fit", curves),
        inter=Link(default[0], default[1], {}, "one node: taken equal to the intra-node link"),
        devices_per_node=max(world_sizes), gemm_table=gemm_table, cores=cores,
        source=f"calibrate() at {time.strftime('%Y-%m-%d %H:%M')}", measurements=raw)


def _ram_bytes() -> float:
    try:
        import os
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8e9
