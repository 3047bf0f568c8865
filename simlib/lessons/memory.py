"""Runs for lesson 07, on every rank: one model, one batch, trained under DDP, ZeRO-1/2/3 or FSDP2, measured.

:func:`run_memory` returns, per rank: the losses, the final (full) parameters, the bytes of each state after a
step, the peak bytes of the whole run (torch's profiler on CPU, ``torch.cuda.max_memory_allocated`` on GPU),
step times (warm-up excluded) and the bytes handed to each collective. :func:`formula` gives the simulator's
numbers for the same configuration; :func:`reference` is the single-process run the variants must equal.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from .. import env
from ..models import BlockMLP, make_regression
from ..parallel import precision as prec
from ..parallel import recompute, zero, zero3
from ..parallel.comm_log import CommLog
from ..parallelize import apply_zero
from .data_parallel import count_all_reduces

__all__ = ["VARIANTS", "run_memory", "reference", "formula", "comm_volume", "volume_formula", "measure_collectives"]

VARIANTS = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp2": 3}


def mlp_problem(width, depth, global_batch, seed, in_features=None):
    torch.manual_seed(seed)
    model = BlockMLP(width, depth, in_features=in_features)
    x, y = make_regression(global_batch, in_features or width, 1, seed=seed)
    return model, x, y


def reference(steps=3, width=32, depth=2, global_batch=16, lr=1e-2, seed=0) -> dict:
    """One process, the whole batch, AdamW: what every variant must reproduce."""
    model, x, y = mlp_problem(width, depth, global_batch, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return dict(losses=losses, params={k: v.detach().clone() for k, v in model.state_dict().items()})


def _build(variant, model, lr, group, counter, layout):
    """Wrap ``model`` and build its optimizer for ``variant``; returns (wrapped, optimizer, ddp_counter)."""
    inner = (
        torch.optim.AdamW
        if layout != "masters"
        else functools.partial(prec.MasterWeightsOptimizer, inner_cls=torch.optim.AdamW)
    )
    if variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model, process_group=group)
        ddp_counter = count_all_reduces(wrapped, group=group)
        return wrapped, inner(wrapped.parameters(), lr=lr), ddp_counter
    if variant in ("zero1", "zero2"):  # the trainer's own wrapping (simlib.parallelize.apply_zero)
        wrapped = apply_zero(model, _STAGE[variant], group, comm_counter=counter)
        opt = zero.ShardedOptimizer(model.parameters(), inner, group=group, comm_counter=counter, lr=lr)
        wrapped.attach(opt)
        return wrapped, opt, None
    if variant == "zero3":
        zero3.check_elementwise(inner)
        wrapped = apply_zero(model, 3, group, comm_counter=counter)
        return wrapped, inner(wrapped.parameters(), lr=lr), None
    if variant == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group or dist.group.WORLD, device_type=next(model.parameters()).device.type)
        for block in recompute.blocks_of(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, inner(model.parameters(), lr=lr), None
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def _full_params(variant, wrapped, model):
    if variant == "zero3":
        return wrapped.full_state_dict()
    out = {}
    for k, v in model.state_dict().items():
        out[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().clone()
    return out


def run_memory(
    variant="zero2",
    steps=3,
    width=32,
    depth=2,
    global_batch=16,
    lr=1e-2,
    seed=0,
    precision=None,
    checkpointing=False,
    measure_peak=True,
    group=None,
    threads=None,
) -> dict:
    """Train ``steps`` AdamW steps of a :class:`BlockMLP` on this rank's shard of the batch, measured.

    ``precision``: None (fp32), "bf16" (autocast, fp32 weights) or "masters" (bf16 model + fp32 master weights).
    """
    if threads:
        torch.set_num_threads(threads)
    group = group or dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if global_batch % world:
        raise ValueError(
            f"rank {rank}: global batch {global_batch} does not split over {world} ranks; use a multiple of {world}"
        )
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    )
    counter = CommLog()  # simlib.parallel.comm_log: every collective ZeRO issues
    out: dict = {"rank": rank, "world_size": world, "variant": variant}
    built: dict = {}
    if device.type == "cpu" and measure_peak:
        _return_freed_memory()  # before anything is allocated, so freed blocks leave the resident set

    def run():
        model, x, y = mlp_problem(width, depth, global_batch, seed)
        model.to(device)
        if precision == "masters":
            model.to(torch.bfloat16)
        b = global_batch // world
        x, y = x[rank * b : (rank + 1) * b].to(device), y[rank * b : (rank + 1) * b].to(device)
        if precision == "masters":
            x = x.to(torch.bfloat16)
        if checkpointing:
            recompute.checkpoint_blocks(recompute.blocks_of(model))
        out["numel"] = sum(p.numel() for p in model.parameters())
        wrapped, opt, ddp_counter = _build(variant, model, lr, group, counter, precision)
        losses, times = [], []
        for step in range(steps):
            counter.reset()
            if ddp_counter is not None:
                ddp_counter.update(calls=0, bytes=0)
            start = time.perf_counter()
            with prec.autocast(device, "bf16" if precision == "bf16" else None):
                pred = wrapped(x)
            loss = nn.functional.mse_loss(pred.float(), y.float())
            loss.backward()
            if hasattr(wrapped, "finish_gradient_synchronization"):
                wrapped.finish_gradient_synchronization()
            opt.step()
            if step == steps - 1:
                out["states"] = zero.state_bytes(wrapped, opt)
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        comm = counter.bytes_by_name()
        if ddp_counter is not None:
            comm["all_reduce"] = ddp_counter["bytes"]
        out.update(losses=losses, step_times=times, comm_bytes=comm)
        built.update(wrapped=wrapped, model=model)

    if not measure_peak:
        run()
    else:
        steps_wanted = steps
        steps = 2
        run()  # warm-up: first-use allocations (thread pools, kernels' buffers) stay out of the peak
        steps = steps_wanted
        out["peak"] = peak_bytes(run, device)
    out["params"] = _full_params(variant, built["wrapped"], built["model"])
    warm = out["step_times"][1:] or out["step_times"]
    out["step_time"] = statistics.median(warm)
    return out


def peak_bytes(fn, device=None) -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it.

    GPU: ``torch.cuda.max_memory_allocated``. CPU (Linux): the process's resident high-water mark (``VmHWM``,
    reset through ``/proc/self/clear_refs``) with glibc told to hand every block of 16 KB or more straight back
    to the system (``mallopt``), so freed tensors leave the resident set at once. torch's profiler
    (:func:`simlib.parallel.accumulate.peak_memory`) is not used here: under ZeRO-3 and FSDP2, which free a
    gathered buffer by resizing its storage, it misses frees and reports a peak that grows with every step.
    """
    import gc

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    import os

    if not os.path.exists("/proc/self/clear_refs"):  # not Linux (macOS, Windows): torch's profiler instead
        import warnings

        from ..parallel.accumulate import peak_memory

        warnings.warn(
            "no /proc here: peak memory comes from torch's profiler, which over-counts under ZeRO-3 and "
            "FSDP2 (it misses frees done by resizing storage)",
            stacklevel=2,
        )
        return peak_memory(fn)
    _return_freed_memory()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _resident()
    fn()
    return int(_high_water() - base)


def tensor_peak_bytes(fn, *inputs) -> int:
    """Peak bytes of the tensors alive while ``fn()`` runs, above ``inputs`` (which it may read).

    Counted by torch's own tracker (``torch.distributed._tools.mem_tracker.MemTracker``, a dispatch mode that
    follows every tensor storage an op creates until it is freed): exact and the same on every run, on CPU and
    GPU alike, where :func:`peak_bytes` reads the process's resident memory, which also holds the allocator's and
    the communication library's buffers (a loaded machine's late frees showed there as one extra block).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    if inputs:
        tracker.track_external(*inputs)
    with tracker:
        before = sum(s["Total"] for s in tracker.get_tracker_snapshot("current").values())
        fn()
    return int(sum(s["Total"] for s in tracker.get_tracker_snapshot("peak").values()) - before)


def _return_freed_memory():
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD: trim the heap top at once
    libc.mallopt(-3, 16 * 1024)  # M_MMAP_THRESHOLD: blocks >= 16 KB are mmapped, so free() unmaps them
    libc.malloc_trim(0)


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _high_water() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def formula(variant, world_size, width=32, depth=2, global_batch=16, precision=None, checkpointing=False) -> dict:
    """The simulator's bytes per rank (``simlib.sim.memory``) for the same model and plan."""
    from ..sim import Strategy, from_module, memory_per_device

    model = BlockMLP(width, depth)
    spec = from_module(model, name="BlockMLP")
    strategy = Strategy(
        dp=world_size,
        zero_stage=_STAGE[variant],
        micro_batch=global_batch // world_size,
        dtype="bf16" if precision == "masters" else "fp32",
        optimizer="adam",
        recompute="full" if checkpointing else "none",
    )
    return memory_per_device(spec, strategy)


# ring traffic per rank for a collective that is handed S bytes (nccl-tests PERFORMANCE.md bus-bandwidth factors;
# a reduce or broadcast to/from each owner in turn adds up to one reduce-scatter / all-gather)
def _factor(kind, n):
    return {"all_reduce": 2 * (n - 1) / n}.get(kind, (n - 1) / n)


def comm_volume(comm_bytes: dict, world_size: int) -> float:
    """Bytes one rank sends per step under ring algorithms, from the bytes it handed to each collective."""
    return sum(_factor(kind, world_size) * b for kind, b in comm_bytes.items())


def volume_formula(variant, numel, world_size, bytes_per_value=4) -> float:
    """ZeRO paper §7: DDP and ZeRO-1/2 move 2Ψ, ZeRO-3 3Ψ (times (n-1)/n per rank on a ring)."""
    psi = numel * bytes_per_value * (world_size - 1) / world_size
    return (3 if _STAGE[variant] == 3 else 2) * psi


def measure_collectives(size_bytes=4 << 20, repeats=10, group=None) -> dict:
    """Median seconds of all_reduce, reduce_scatter and all_gather on the same S bytes (S in, S out of the ring).

    A native reduce-scatter sends half an all-reduce's bytes; if both take as long, the backend emulates it.
    """
    group = group or dist.group.WORLD
    n = dist.get_world_size(group)
    numel = size_bytes // 4 // n * n
    full, part = torch.ones(numel), torch.empty(numel // n)
    ops = {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "reduce_scatter": lambda: zero.reduce_scatter_shards(part, full, group=group),
        "all_gather": lambda: zero.all_gather_shards(full, part, group=group),
    }
    times = {}
    for name, op in ops.items():
        op()
        samples = []
        for _ in range(repeats):
            dist.barrier(group=group)
            start = time.perf_counter()
            op()
            samples.append(time.perf_counter() - start)
        times[name] = statistics.median(samples)
    return times


def sweep(variants=VARIANTS, world_sizes=(1, 2, 4), options=None, **kwargs) -> list[dict]:
    """Run on every rank of one cluster: each variant at each world size, on the sub-group of the first ranks.

    One warm cluster of max(world_sizes) ranks serves every size (the other ranks wait at the next collective).
    ``options``: {label: extra kwargs for run_memory}. Returns rank 0's rows: one per (world size, variant,
    option), the state bytes as the maximum over the ranks of the sub-group.
    """
    options = options or {"fp32": {}}
    rank = dist.get_rank()
    rows = []
    for world in world_sizes:
        group = dist.new_group(list(range(world)), timeout=env.collective_timeout())  # the run's timeout
        for label, extra in options.items():
            for variant in variants:
                if rank < world:
                    r = run_memory(variant, group=group, **dict(kwargs, **extra))
                    mine = dict(
                        states=r["states"],
                        peak=r["peak"] if "peak" in r else None,
                        step_time=r["step_time"],
                        comm=r["comm_bytes"],
                        numel=r["numel"],
                        losses=r["losses"],
                        params=r["params"] if rank == 0 else None,
                    )
                    gathered = [None] * world
                    dist.all_gather_object(gathered, mine, group=group)
                    if rank == 0:
                        rows.append(dict(world_size=world, variant=variant, option=label, ranks=gathered))
                dist.barrier()
    return rows
