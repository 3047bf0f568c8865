"""Gradient accumulation: k micro-batches, one optimizer step, the same update as one big batch.

Gradients add up across backward calls, so running backward on k micro-batches of size b and then
stepping once gives the gradient of one batch of size k·b — provided each micro-batch's loss is divided
by k (a mean over the big batch is the mean of the k micro-batch means). Forgetting the 1/k is the
classic bug: the update is k times too large.

With data parallelism, only the last micro-batch needs to communicate: inside ``model.no_sync()`` the
wrapper (DDP, or simlib's) skips its all-reduce and the gradients pile up locally; the last backward,
outside ``no_sync``, all-reduces the accumulated sum once (torch DDP docs, "no_sync").
"""

from __future__ import annotations

import gc
from contextlib import nullcontext

import torch
from torch import nn

__all__ = [
    "split_micro_batches",
    "accumulation_step",
    "peak_memory",
    "allocation_trace",
    "profiled_peak",
    "count_every_thread",
]


def split_micro_batches(x: torch.Tensor, y: torch.Tensor, accumulation_steps: int):
    """``accumulation_steps`` equal micro-batches of (x, y), in order."""
    _check_k(accumulation_steps)
    if x.shape[0] % accumulation_steps:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {accumulation_steps} equal micro-batches")
    return list(zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps)))


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the number of micro-batches (accumulation steps) must be an int >= 1, got {k!r}")
    return k


def accumulation_step(
    model,
    optimizer,
    micro_batches,
    loss_fn=nn.functional.mse_loss,
    scale_loss: bool = True,
    use_no_sync: bool = True,
    timeline=None,
    autocast=nullcontext,
    loss_scale: float = 1.0,
) -> float:
    """One optimizer step over ``micro_batches``; returns the mean loss over all their samples.

    Each micro-batch's loss is weighted by its share of the samples, n_i / N (1/k when they are equal), so
    micro-batches of unequal sizes (the last one of an epoch, say) still give the gradient of the mean over
    the whole batch; ``loss_fn`` must average over the samples of a batch (``reduction="mean"``).
    ``scale_loss=False`` reproduces the missing-1/k bug; ``use_no_sync=False`` communicates on every
    micro-batch (same result, k times the messages). Works for a plain module, DDP, or simlib's wrappers.
    ``optimizer=None``: gradients only (``simlib.train`` steps itself, after unscaling and clipping);
    ``autocast``: the context of each forward (mixed precision); ``loss_scale``: multiplies each loss before
    backward (fp16 loss scaling; the returned loss is unscaled).
    """
    micro_batches = list(micro_batches)
    k = len(micro_batches)
    if k == 0:
        raise ValueError("no micro-batches: pass at least one (x, y) pair")
    sizes = [len(x) for x, _ in micro_batches]
    if 0 in sizes:
        raise ValueError(
            f"micro-batch {sizes.index(0)} is empty (sizes {sizes}): its mean loss would be nan; "
            "drop it or split the batch into fewer micro-batches"
        )
    total_size = sum(sizes)
    finish = getattr(model, "finish_gradient_synchronization", None)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        skip_sync = use_no_sync and not last and hasattr(model, "no_sync")
        with model.no_sync() if skip_sync else nullcontext():
            with timeline.span("forward") if timeline is not None else nullcontext(), autocast():
                loss = loss_fn(model(x), y)
            with timeline.span("backward") if timeline is not None else nullcontext():
                weight = sizes[i] / total_size  # = 1/k for equal micro-batches
                scaled = loss * weight if scale_loss else loss
                (scaled * loss_scale if loss_scale != 1 else scaled).backward()
            if finish is not None and (last or not use_no_sync):
                finish()  # simlib wrappers: waits for / runs the all-reduce; inside no_sync a no-op
        total += float(loss.detach()) * sizes[i]
    if optimizer is not None:
        with timeline.span("optimizer") if timeline is not None else nullcontext():
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return total / total_size


def peak_memory(fn, *args, **kwargs) -> int:
    """Peak bytes that ``fn(*args, **kwargs)`` allocated above what was live when it started.

    Measured, on CPU too: torch's profiler records every allocation and free (``profile_memory=True``), each
    with the allocator's count of live bytes after it; the largest count less the count as ``fn`` started is the
    high-water mark (:func:`profiled_peak`). On CUDA use ``torch.cuda.max_memory_allocated`` instead (cheaper,
    same meaning).

    The count is the process's, every thread's (:func:`count_every_thread`): a collective's tensor whose last
    reference a backend thread drops (Gloo's worker, racing the caller after the work completes) is freed on
    that thread, which the profiler does not record. Seen: a 2-rank tensor-parallel step with 4 micro-batches
    measured 23.7 MB on one rank and 22.7 MB on the other by its own records, 19.5 MB on both by the count. The
    count agrees with the process's resident high-water mark (:func:`simlib.lessons.memory.peak_bytes`) to a few
    percent on data-, tensor- and pipeline-parallel steps of the GPT project, where the records alone read up
    to 2x high. Frees count: a step that starts by dropping the last step's gradients (``zero_grad(set_to_none=
    True)``) peaks that much lower above its start.
    """
    from torch.profiler import ProfilerActivity, profile

    from ..env import quiet_profiler

    quiet_profiler()  # Kineto's start/stop lines off stderr; whatever ``fn`` writes there still shows
    count_every_thread()
    gc.collect()  # a cycle of an earlier run (a model, its optimizer) collected inside ``fn`` would lower the count
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args, **kwargs)
    return profiled_peak(prof)[0]


_COUNTING = None  # whether c10 counts every thread's CPU allocations (None: not asked yet)


def count_every_thread() -> bool:
    """Have c10's CPU allocator keep its count of live bytes for every thread, for the rest of this process.

    By default it counts only on threads where torch's profiler records memory, so a block freed on any other
    thread stays counted as live (and has no free record). ``FLAGS_caffe2_report_cpu_memory_usage`` (c10,
    ``CPUAllocator.cpp``) makes it count on all of them; torch has no Python setter for it, so it is set in
    libc10 by name. Left on, not toggled: a block allocated while it was on and freed while it was off would
    stay in the allocator's table and be taken off again when its address is reused. Returns False where the
    library or the flag cannot be found (a build without it): :func:`profiled_peak` then replays the records
    of the profiled thread alone."""
    global _COUNTING
    if _COUNTING is None:
        import ctypes
        import glob
        import os

        _COUNTING = False
        lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        for path in glob.glob(os.path.join(lib_dir, "*c10.*")):
            try:
                ctypes.c_bool.in_dll(ctypes.CDLL(path), "FLAGS_caffe2_report_cpu_memory_usage").value = True
                _COUNTING = True
                break
            except (OSError, ValueError):
                continue
    return _COUNTING


def allocation_trace(prof) -> list[tuple[int, int, int]]:
    """(time in ns, bytes: + allocated, - freed, live bytes after it) of every CPU allocation and free ``prof``
    (a finished ``torch.profiler.profile(profile_memory=True)``) recorded, in time order. A block allocated
    before profiling started has no record of its free (torch warns "Memory block of unknown size ...")."""
    from torch._C._profiler import _EventType

    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    return sorted(
        (n.start_time_ns, n.extra_fields.alloc_size, n.extra_fields.total_allocated)
        for n in walk(prof.profiler.kineto_results.experimental_event_tree())
        if n.tag == _EventType.Allocation and n.extra_fields.alloc_size and n.extra_fields.device.type == "cpu"
    )


def profiled_peak(prof) -> tuple[int, int]:
    """(peak, kept): the most CPU bytes live at once during ``prof``'s profile above what was live as it began,
    and what was still live at its last record. From the allocator's count (every thread's, after
    :func:`count_every_thread`); otherwise by replaying the profiled thread's own records."""
    trace = allocation_trace(prof)
    if not trace:
        return 0, 0
    if _COUNTING:
        start = trace[0][2] - trace[0][1]
        return max(max(live for _, _, live in trace) - start, 0), trace[-1][2] - start
    live = peak = 0
    for _, delta, _ in trace:
        live += delta
        peak = max(peak, live)
    return peak, live
