"""Lesson 03's runs: data parallelism with gradient accumulation (``simlib.parallel.accumulate``), against lesson
02's one-process reference.

    out = run_accumulation(accumulation_steps=4)                # equals reference_run() on the whole batch
    bad = run_accumulation(4, scale_loss=False)                 # the missing 1/k: a k times larger update
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from ..parallel.accumulate import accumulation_step, peak_memory, split_micro_batches  # noqa: F401 - taught here
from .data_parallel import _setup, count_all_reduces

__all__ = ["run_accumulation", "missing_scale_effect", "accumulation_step", "split_micro_batches", "peak_memory"]


def run_accumulation(
    accumulation_steps: int = 4,
    steps: int = 3,
    global_batch: int = 64,
    width: int = 64,
    depth: int = 3,
    lr: float = 0.05,
    seed: int = 0,
    mode: str = "ddp",
    use_no_sync: bool = True,
    scale_loss: bool = True,
    warmup: int = 0,
    timeline: bool = False,
    bucket_cap_mb: float = 25.0,
) -> dict:
    """One rank of data parallelism with accumulation (call on every rank, or in one process).

    Each rank's shard of the global batch is split into ``accumulation_steps`` micro-batches, so the
    result must equal ``reference_run`` on the whole global batch. Returns the final state, the losses,
    the number of all-reduce calls and bytes (for DDP), and with ``timeline=True`` the gathered timeline.
    """
    from ..models import shard
    from ..parallel.data import wrap
    from ..timeline import Timeline, summarize

    distributed = dist.is_initialized() and dist.get_world_size() > 1
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    from ..env import device as _device

    dev = _device()
    model, x, y = _setup(width, depth, global_batch, seed)
    model = model.to(dev)
    x, y = shard(x, rank, world_size).to(dev), shard(y, rank, world_size).to(dev)
    tl = Timeline(warmup=warmup, device=dev) if timeline else None
    dp_model = wrap(model, mode, bucket_cap_mb, tl) if distributed else model
    counter = count_all_reduces(dp_model, tl) if mode == "ddp" and distributed else None
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    micro_batches = split_micro_batches(x, y, accumulation_steps)
    losses = []
    for step in range(steps):
        with tl.step(step) if tl is not None else nullcontext():
            losses.append(
                accumulation_step(
                    dp_model, opt, micro_batches, scale_loss=scale_loss, use_no_sync=use_no_sync, timeline=tl
                )
            )
    out = {
        "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "losses": losses,
        "all_reduce_calls": counter["calls"] if counter else None,
        "all_reduce_bytes": counter["bytes"] if counter else None,
    }
    if timeline:
        df = tl.gather()
        out["timeline"], out["summary"] = df, summarize(df)
    return out


def _one_process(optimizer: str, lr: float, k: int, scale_loss: bool, steps: int, width: int, depth: int, seed: int):
    model, x, y = _setup(width, depth, 16 * k, seed)
    opt = (
        torch.optim.SGD(model.parameters(), lr=lr)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    )
    start = [p.detach().clone() for p in model.parameters()]
    for _ in range(steps):
        accumulation_step(model, opt, split_micro_batches(x, y, k), scale_loss=scale_loss)
    return torch.cat([(p.detach() - s).flatten() for p, s in zip(model.parameters(), start)])


def missing_scale_effect(
    optimizer: str = "sgd", k: int = 4, lr: float = 0.01, steps: int = 3, width: int = 32, depth: int = 2, seed: int = 0
) -> dict:
    """What the missing 1/k does to one optimizer, in one process: three runs of ``steps`` accumulation steps.

    ``correct`` divides each micro-batch's loss by k; ``missing`` does not (a gradient k times too large);
    ``lr_times_k`` divides by k but multiplies the learning rate by k. Returns the relative distance of
    ``missing``'s total update from each of the other two. SGD's update is lr·g, so ``missing`` equals
    ``lr_times_k`` (to rounding). AdamW's is lr·m/(√v + ε): m grows by k and √v by k, so the scale cancels and
    ``missing`` nearly equals ``correct`` (only ε notices) — and ``lr_times_k`` is k times too large, decay included.
    """
    if optimizer not in ("sgd", "adamw"):
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}")
    args = dict(k=k, steps=steps, width=width, depth=depth, seed=seed)
    correct = _one_process(optimizer, lr, scale_loss=True, **args)
    missing = _one_process(optimizer, lr, scale_loss=False, **args)
    lr_times_k = _one_process(optimizer, lr * k, scale_loss=True, **args)

    def distance(a, b):
        return float((a - b).norm() / b.norm())

    return dict(
        optimizer=optimizer,
        k=k,
        missing_vs_correct=distance(missing, correct),
        missing_vs_lr_times_k=distance(missing, lr_times_k),
        update_norm_ratio=float(missing.norm() / correct.norm()),
    )
