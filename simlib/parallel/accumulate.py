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

from contextlib import nullcontext

import torch
from torch import nn

__all__ = ["split_micro_batches", "accumulation_step", "peak_memory", "allocation_trace"]


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


def accumulation_step(model, optimizer, micro_batches, loss_fn=nn.functional.mse_loss, scale_loss: bool = True,
                      use_no_sync: bool = True, timeline=None, autocast=nullcontext, loss_scale: float = 1.0) -> float:
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
        raise ValueError(f"micro-batch {sizes.index(0)} is empty (sizes {sizes}): its mean loss would be nan; "
                         "drop it or split the batch into fewer micro-batches")
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
    with its own time; replaying them in time order gives the high-water mark. On CUDA use
    ``torch.cuda.max_memory_allocated`` instead (cheaper, same meaning).

    The records are read one by one (:func:`allocation_trace`), not through the ops' ``self_cpu_memory_usage``:
    that roll-up loses frees. Seen: a pipeline stage with activation checkpointing, between Gloo sends and
    receives, showed every micro-batch's forward temporaries as never freed (21.5 MB where the allocations
    themselves peak at 7.6 MB, and glibc's own count agreed with the allocations).
    """
    from torch.profiler import ProfilerActivity, profile

    from ..env import quiet_profiler
    quiet_profiler()  # Kineto's start/stop lines off stderr; whatever ``fn`` writes there still shows
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args, **kwargs)
    live = peak = 0
    for _, delta in allocation_trace(prof):
        live += delta
        peak = max(peak, live)
    return int(peak)


def allocation_trace(prof) -> list[tuple[int, int]]:
    """(time in ns, bytes: + allocated, - freed) of every CPU allocation and free ``prof`` (a finished
    ``torch.profiler.profile(profile_memory=True)``) recorded, in time order. A block allocated before profiling
    started has no record of its free (torch warns "Memory block of unknown size ...")."""
    cpu = torch.autograd.DeviceType.CPU
    return sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == cpu and e.nbytes())
