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

from .hardware import Hardware, Link, fit_alpha_beta, fit_p2p
from .kernels import (
    _all_to_all_times,
    _kernels,
    _mean_time,
    _median_time,
    _singles,
    _small_sync,
    block_op_time,
    combine_kernels,
    in_situ_comm,
    small_op_time,
)

# (m, k, n) of the GEMMs we time: the shapes of the course's MLP layers, forward / grad-input (batch × width ×
# width) and grad-weight (width × batch × width), for widths 512 and 1024, plus one large square
GEMM_SHAPES = (
    [(m, w, w) for w in (512, 1024) for m in (16, 64, 128, 256)]
    + [(w, m, w) for w in (512, 1024) for m in (16, 64, 128, 256)]
    + [(1024, 1024, 1024)]
)
COMM_SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes of one all-reduce
_GROUPS: dict = {}


def subgroup(world_size: int):
    """The process group of ranks 0..world_size-1 (made once; every rank of the cluster must ask)."""
    import torch.distributed as dist

    if world_size == dist.get_world_size():
        return None  # the default group
    return _group(range(world_size))


def _group(ranks):
    """The process group of ``ranks``, made once per world (every rank of the cluster must ask, in the same
    order). A group of a world that has gone (a cluster closed, another started in this process) is dropped,
    not reused, as :meth:`simlib.parallel.mesh.Mesh.build` does."""
    import torch.distributed as dist

    from .. import env

    world = dist.group.WORLD
    for gone in [k for k in _GROUPS if k[0] is not world]:
        del _GROUPS[gone]
    key = (world, tuple(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key[1]), timeout=env.collective_timeout())
    return _GROUPS[key]


def measure_here(
    world_size: int,
    threads: int,
    gemm_shapes=GEMM_SHAPES,
    comm_sizes=COMM_SIZES,
    repeats: int = 5,
    comm_repeats: int = 10,
    min_time: float = 0.2,
    cycle_repeats: int = 5,
    kernels: bool | str = False,
):
    """Run on every rank of a cluster: ranks < ``world_size`` measure together; the rest return None.
    ``kernels``: also time lesson 09's kernels (:func:`_kernels`, :func:`_small_sync`) and what calls add to compute
    in situ; ``"comm"``: only the calls (what the planner's GPT prices with), not the attention and MoE kernels."""
    import torch
    import torch.distributed as dist

    group = subgroup(world_size)
    singles = _singles() if kernels is True else None  # every rank takes part in making groups, measuring or not
    sides = side_groups(world_size) if kernels else {}
    rank = dist.get_rank()
    if rank >= world_size:
        return None
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    sync = (lambda: dist.barrier(group=group)) if world_size > 1 else (lambda: None)
    try:
        sync()
        gemms = []
        for m, k, n in gemm_shapes:
            a, b = torch.randn(m, k), torch.randn(k, n)
            if world_size > 1:
                dist.barrier(group=group)  # every rank times the same shape at the same time
            # time each shape for a while: a short burst right after a barrier gets more than its share
            # of a busy CPU (the scheduler favours a task that just slept), a training step does not
            t = _mean_time(lambda: a @ b, repeats, min_time=min_time)
            gemms.append((2 * m * k * n / 1e9, 2 * m * k * n / t))
        x, y = torch.randn(32 << 20), torch.randn(32 << 20)  # 128 MB each: far bigger than any cache
        sync()
        mem_bw = 3 * x.numel() * 4 / _mean_time(lambda: x.add_(y), repeats, min_time=min_time)
        x = y = None  # free the 256 MB now
        layer_factor = _layer_factor(repeats, min_time, sync)
        g, h = torch.randn(1 << 20), torch.randn(1 << 20)  # one 1024x1024 weight's gradient (4 MB)
        sync()
        acc_bw = (
            3 * g.numel() * 4 / _mean_time(lambda: g.add_(h), repeats, min_time=min_time)
        )  # AccumulateGrad: grad += new
        sync()
        kernels = (
            (_kernels(singles[rank], min_time, sync) if kernels is True else {"op": small_op_time(min_time)})
            if kernels
            else None
        )  # "comm": the host's cost per op too
        if kernels is not None:  # a GPT block's ops as a rank sharing the cores pays them (the planner's GPT)
            sync()
            kernels["block_op"] = block_op_time(min_time)
        comm, cycles, p2p = [], [], []
        if world_size > 1:
            for size in comm_sizes:
                buf = torch.zeros(size // 4)
                dist.barrier(group=group)
                t = _median_time(lambda: dist.all_reduce(buf, group=group), comm_repeats)
                comm.append((size, t))
            cycles = _sync_cycles(group, max(comm_sizes), cycle_repeats)
            if kernels is not None:
                kernels["sync"] = _small_sync(group)
                kernels["a2a"] = _all_to_all_times(group, comm_repeats)
                kernels["in_situ"] = in_situ_comm(group)
                # groups of g ranks side by side (tp, cp, ep groups smaller than the box): each waits for peers
                # that share the cores with the other groups' ranks
                kernels["in_situ_groups"] = {
                    g: in_situ_comm(groups[rank // g], kinds=SIDE_KINDS) for g, groups in sides.items()
                }
            if world_size == 2:
                p2p = _ping_pong(group, rank, P2P_SIZES, comm_repeats)
        return {
            "gemms": gemms,
            "mem_bw": mem_bw,
            "comm": comm,
            "acc_bw": acc_bw,
            "cycles": cycles,
            "p2p": p2p,
            "layer_factor": layer_factor,
            "kernels": kernels,
        }
    finally:
        torch.set_num_threads(old_threads)


SIDE_KINDS = ("hop", "hop_overlapped", "all_reduce")  # calls measured in groups side by side


def side_groups(world_size: int) -> dict:
    """{g: [group of ranks 0..g-1, g..2g-1, ...]} for each group size 2 <= g < world_size that divides it, made once
    (every rank of the cluster must ask, in the same order)."""
    return {
        g: [_group(range(i, i + g)) for i in range(0, world_size, g)]
        for g in range(2, world_size)
        if world_size % g == 0
    }


P2P_SIZES = [16 << 10, 256 << 10, 1 << 20]  # bytes of one pipeline message (activations of a micro-batch)
SYNC_GEMM, SYNC_GEMMS = (128, 1024, 1024), 8  # the compute burst of one sync cycle: ~3 ms per GEMM on one core


LAYER_STACK = (4, 1024, 128)  # layers, width, batch of the autograd-vs-bare-GEMM micro-benchmark


def _layer_factor(repeats: int, min_time: float, sync=lambda: None) -> float:
    """Time of forward + backward through a stack of ``nn.Linear`` layers over the same GEMMs run bare.

    The GEMM table times ``a @ b`` on the same hot operands again and again; a real layer multiplies by a
    transposed weight (x·Wᵀ, gᵀ·x), adds the bias and reduces its gradient, allocates its outputs, goes
    through autograd, and finds the previous layer's 4 MB weight evicted from cache. The stack is 4 layers
    of 1024 (16 MB of weights, more than the caches), batch 128; grads are set to None so AccumulateGrad is
    not in it (that term is measured apart). ``sync`` (a barrier) runs first, so ranks side by side time the
    same thing at the same time; real and bare blocks alternate and the median of their ratios is returned
    (>= 1 in practice).
    """
    import torch

    layers, width, batch = LAYER_STACK
    stack = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    x = torch.randn(batch, width, requires_grad=True)
    grad_out = torch.randn(batch, width)

    def real():
        for p in stack.parameters():
            p.grad = None
        x.grad = None
        stack(x).backward(grad_out)

    a, w, gt = torch.randn(batch, width), torch.randn(width, width), torch.randn(width, batch)

    def bare():  # forward, grad input, grad weight: three plain GEMMs per layer, operands hot in cache
        for _ in range(layers):
            a @ w
            a @ w
            gt @ a

    sync()
    ratios = []
    for _ in range(max(repeats, 5)):  # alternate short blocks: a drifting load hits both sides of each ratio
        t_real = _mean_time(real, 1, min_time=max(min_time / 4, 0.04), blocks=1)
        ratios.append(t_real / _mean_time(bare, 1, min_time=max(min_time / 4, 0.04), blocks=1))
    return float(np.median(ratios))


def _sync_cycles(group, size: int, repeats: int):
    """Training-like cycles: a fixed compute burst, then an all-reduce of ``size`` bytes (as a DP step).

    Returns [(burst seconds, all-reduce seconds)] on this rank. Ranks that run the same work side by side do
    not finish together (the OS shares cores unevenly, worst when processes outnumber cores), and an all-reduce
    that starts after compute (cold caches, Gloo's threads waking up) is slower than back-to-back ones.
    """
    import torch
    import torch.distributed as dist

    m, k, n = SYNC_GEMM
    a, b = torch.randn(m, k), torch.randn(k, n)
    buf = torch.zeros(size // 4)
    out = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(SYNC_GEMMS):
            a @ b
        t1 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        t2 = time.perf_counter()
        if i:  # the first is a warm-up
            out.append((t1 - t0, t2 - t1))
    return out


def _ping_pong(group, rank: int, sizes, repeats: int):
    """Ranks 0 and 1: send a message and get it back (the pipeline executor's isend / recv); one way = half."""
    import torch
    import torch.distributed as dist

    peer = dist.get_global_rank(group, 1 - rank) if group is not None else 1 - rank
    out = []
    for size in sizes:
        buf = torch.zeros(size // 4)

        def once():
            if rank == 0:
                dist.isend(buf, dst=peer, group=group).wait()
                dist.recv(buf, src=peer, group=group)
            else:
                dist.recv(buf, src=peer, group=group)
                dist.isend(buf, dst=peer, group=group).wait()

        dist.barrier(group=group)
        out.append((size, _median_time(once, repeats) / 2))
    return out


def sync_factors(results):
    """(straggler, comm_in_situ) from every rank's sync cycles (see :func:`_sync_cycles`).

    straggler = median over cycles of  max_r burst_r / mean_r burst_r  (a synchronous step waits for the
    slowest rank); comm_in_situ = median over cycles of  [max_r (burst_r + allreduce_r) − max_r burst_r]
    divided by the back-to-back all-reduce time of the same size ``isolated`` (the slowest rank's median).
    Returns None where no cycles were measured.
    """
    res = [r for r in results if r is not None and r.get("cycles")]
    if not res:
        return None
    n = min(len(r["cycles"]) for r in res)
    strag, insitu = [], []
    for i in range(n):
        bursts = [r["cycles"][i][0] for r in res]
        ends = [r["cycles"][i][0] + r["cycles"][i][1] for r in res]
        strag.append(max(bursts) / float(np.mean(bursts)))
        insitu.append(max(ends) - max(bursts))
    isolated = max(r["comm"][-1][1] for r in res)
    return float(np.median(strag)), max(float(np.median(insitu)) / isolated, 1.0)


def _combine(results):
    """Ranks measured side by side: a GEMM's rate is the mean over ranks, a collective's time the slowest."""
    res = [r for r in results if r is not None]
    gemms = [
        (res[0]["gemms"][i][0], float(np.mean([r["gemms"][i][1] for r in res]))) for i in range(len(res[0]["gemms"]))
    ]
    comm = [(res[0]["comm"][i][0], max(r["comm"][i][1] for r in res)) for i in range(len(res[0]["comm"]))]
    return (
        gemms,
        float(np.mean([r["mem_bw"] for r in res])),
        comm,
        float(np.mean([r["acc_bw"] for r in res])),
        float(np.mean([r["layer_factor"] for r in res])),
    )


def calibrate(
    cluster=None,
    world_sizes=(1, 2, 4),
    repeats: int | None = None,
    timeout: float = 120.0,
    min_time: float | None = None,
    kernels: bool | str = False,
    gemm_shapes=(),
):
    """Measure this machine and return a :class:`~simlib.sim.hardware.Hardware` for it.

    Measures, for each world size w (w processes running at once, cores // w threads each — the default of
    :class:`simlib.Cluster` — and for w = 1 also every thread count up to the cores): GEMM FLOP/s against GEMM
    size, memory bandwidth (``x.add_(y)``), and a ring fit of Gloo all-reduce times (α per step, bus bandwidth).
    ``Hardware.overheads`` gets the terms a real multi-process step adds to those parts: per world size the
    straggler factor, the layer factor (autograd Linear layers over bare GEMMs, :func:`_layer_factor`), the
    all-reduce-after-compute factor (:func:`sync_factors`), the bandwidth of
    ``grad.add_(new)`` on a weight-sized gradient (AccumulateGrad, once per micro-batch), and for 2 ranks a
    point-to-point (α, B) fitted to an isend/recv ping-pong (pipeline messages), and lesson 09's eager kernels
    (ring-attention blocks, SDPA, one small autograd op, a small collective's wait: :func:`_kernels`, the
    slowest rank's) and what collectives add to the compute around them, whole and in groups side by side
    (:func:`simlib.sim.kernels.in_situ_comm`), when ``kernels`` (``"comm"``: the calls only, what the
    planner's GPT needs) (a few seconds more per world size; :mod:`simlib.sim.context_experts`
    uses them).
    ``cluster``: a warm cluster with at least ``max(world_sizes)`` ranks (one is started and closed if None).
    ``gemm_shapes``: (m, k, n) shapes timed besides the course's MLP table — a model's own GEMMs
    (:func:`model_gemm_shapes`): on a CPU a GEMM's rate depends on its shape, not only its FLOPs, so a shape
    the table lacks is priced from GEMMs of other shapes and the same FLOPs (a hidden-128 GEMM ran ~2.5x
    slower here than table shapes of its FLOPs).
    """
    from .. import env
    from ..launch import Cluster, OversubscribedWarning

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
    shapes = list(GEMM_SHAPES) + sorted({tuple(int(d) for d in g) for g in gemm_shapes} - set(GEMM_SHAPES))
    try:
        gemm_table, mem, links, curves, raw = {}, {}, {}, {}, {}
        overheads = {
            "straggler": {},
            "comm_in_situ": {},
            "accumulate_grad_Bps": {},
            "layer_factor": {},
            "gemm_shapes": {},
            "p2p": None,
            "kernels": {},
        }
        for w in world_sizes:
            thread_counts = range(1, cores + 1) if w == 1 else [max(1, cores // w)]
            for threads in thread_counts:
                out = cluster.call(
                    measure_here,
                    (w, threads),
                    {
                        "repeats": repeats,
                        "min_time": min_time,
                        "gemm_shapes": shapes,
                        "kernels": kernels if threads == max(1, cores // w) else False,
                    },
                    timeout=timeout,
                )
                gemms, mem_bw, comm, acc_bw, layer_factor = _combine(out)
                gemm_table[(w, threads)] = gemms
                overheads["layer_factor"][(w, threads)] = layer_factor
                overheads["gemm_shapes"][(w, threads)] = {tuple(shape): rate for shape, (_, rate) in zip(shapes, gemms)}
                raw[(w, threads)] = {
                    "gemms": gemms,
                    "mem_bw": mem_bw,
                    "comm": comm,
                    "cycles": [r["cycles"] for r in out if r],
                    "p2p": [r["p2p"] for r in out if r],
                }
                if threads == max(1, cores // w):
                    mem[w] = mem_bw
                    overheads["accumulate_grad_Bps"][w] = acc_bw
                    if combine_kernels(out):
                        overheads["kernels"][w] = combine_kernels(out)
                    factors = sync_factors(out)
                    if factors:
                        overheads["straggler"][w], overheads["comm_in_situ"][w] = factors
                    p2p = [r["p2p"] for r in out if r and r["p2p"]]
                    if p2p and overheads["p2p"] is None:  # one way: the slower of the two ranks' halves
                        pts = [(p2p[0][i][0], max(q[i][1] for q in p2p)) for i in range(len(p2p[0]))]
                        overheads["p2p"] = fit_p2p([p[0] for p in pts], [p[1] for p in pts])
                if comm:
                    alpha, bw = fit_alpha_beta([c[0] for c in comm], [c[1] for c in comm], w)
                    links[w] = (alpha, bw)
                    curves[w] = comm
    finally:
        if own:
            cluster.close()
    default = links.get(2) or next(iter(links.values()), (1e-3, 1e9))
    return Hardware(
        name=f"this machine ({cores} cores, calibrated)",
        peak_flops={},
        memory_bytes=_ram_bytes(),
        memory_bandwidth=mem,
        intra=Link(default[0], default[1], links, "calibrate(): Gloo all-reduce fit", curves),
        inter=Link(default[0], default[1], {}, "one node: taken equal to the intra-node link"),
        devices_per_node=max(world_sizes),
        gemm_table=gemm_table,
        cores=cores,
        source=f"calibrate() at {time.strftime('%Y-%m-%d %H:%M')}",
        measurements=raw,
        overheads=overheads,
    )


def _ram_bytes() -> float:
    try:
        import os

        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8e9


def model_gemm_shapes(model, strategies) -> list:
    """Every (m, k, n) GEMM one micro-batch of ``model`` runs under ``strategies`` (a layer's forward, recomputation
    and backward, the logits head): the shapes to hand :func:`calibrate` so that each is priced at its own rate."""
    from .layer import head_ops
    from .layer_strategy import strategy_layer_ops

    shapes = set()
    for s in strategies:
        parts = [strategy_layer_ops(model, s), head_ops(model, s.micro_batch, s.vocab_tp, cp=s.cp)]
        for part in parts:
            for ops in part.values():
                # a batched GEMM (count > 1: attention's per-head products) runs as one bmm call, not count
                # separate ones: its single-call rate would overcharge it, so it keeps the table's
                shapes.update(
                    tuple(int(d) for d in op.shape) for op in ops if op.kind == "gemm" and op.shape and op.count == 1
                )
    return sorted(shapes)
