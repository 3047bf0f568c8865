"""Lesson 02's runs: each data-parallel wrapper of ``simlib.parallel.data`` against the one-process reference.

    reference = reference_run(steps=3)                          # one process, the whole global batch
    outs = cluster.run(run_data_parallel, "bucket", steps=3)    # every rank: its shard, the same final weights

``count_all_reduces`` makes DDP's communication visible (a comm hook that counts calls and bytes and puts each
bucket on the timeline); lessons 03 and 07 use it too.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from ..parallel.data import MODES, wrap  # noqa: F401 - MODES: the variants a lesson loops over

__all__ = ["MODES", "train_steps", "reference_run", "run_data_parallel", "count_all_reduces", "exposed_comm"]


def _span(timeline, kind, name=None):
    return timeline.span(kind, name=name) if timeline is not None else nullcontext()


def train_steps(model, optimizer, x, y, steps: int, timeline=None, loss_fn=nn.functional.mse_loss):
    """``steps`` plain steps on this rank's (x, y); returns the losses. Works for any wrapper or none."""
    finish = getattr(model, "finish_gradient_synchronization", None)
    losses = []
    for step in range(steps):
        with timeline.step(step) if timeline is not None else nullcontext():
            optimizer.zero_grad(set_to_none=False)
            with _span(timeline, "forward"):
                loss = loss_fn(model(x), y)
            with _span(timeline, "backward"):
                loss.backward()
            if finish is not None:
                finish()
            with _span(timeline, "optimizer"):
                optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _setup(width, depth, global_batch, seed):
    from ..models import MLP, make_regression

    torch.manual_seed(seed)
    model = MLP(width, depth)
    x, y = make_regression(global_batch, width, seed=seed + 1)
    return model, x, y


def reference_run(
    steps: int = 3, global_batch: int = 64, width: int = 64, depth: int = 3, lr: float = 0.05, seed: int = 0
) -> dict:
    """The single-process run on the whole global batch that every data-parallel run must equal."""
    model, x, y = _setup(width, depth, global_batch, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = train_steps(model, opt, x, y, steps)
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def run_data_parallel(
    mode: str = "bucket",
    steps: int = 3,
    global_batch: int = 64,
    width: int = 64,
    depth: int = 3,
    lr: float = 0.05,
    seed: int = 0,
    bucket_cap_mb: float = 25.0,
    warmup: int = 0,
    timeline: bool = False,
) -> dict:
    """One rank of a data-parallel run (call on every rank): same model and data as :func:`reference_run`.

    Rank r trains on the r-th contiguous shard of the global batch. Returns this rank's final state,
    its losses, and with ``timeline=True`` the gathered timeline (every rank) and its summary.
    Outside a process group (or with one rank) it trains the plain model: the one-process measurement.
    """
    from ..models import shard
    from ..timeline import Timeline, summarize

    distributed = dist.is_initialized() and dist.get_world_size() > 1
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    from ..env import device as _device

    dev = _device()
    model, x, y = _setup(width, depth, global_batch, seed)
    model, x, y = model.to(dev), x.to(dev), y.to(dev)
    tl = Timeline(rank=rank, warmup=warmup, device=dev) if timeline else None
    dp_model = wrap(model, mode, bucket_cap_mb, tl) if distributed else model
    if distributed and mode == "ddp" and tl is not None:  # DDP is opaque: a comm hook shows its buckets on the timeline
        count_all_reduces(dp_model, tl)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = train_steps(dp_model, opt, shard(x, rank, world_size), shard(y, rank, world_size), steps, tl)
    out = {"state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, "losses": losses}
    if timeline:
        df = tl.gather()
        out["timeline"], out["summary"] = df, summarize(df)
    return out


def count_all_reduces(ddp_model, timeline=None, group=None) -> dict:
    """Register a DDP comm hook that counts all-reduce calls and bytes; returns the live counter dict.

    The hook does what DDP's default does (divide by the size of ``group``, all-reduce the bucket over it); with
    a timeline, each bucket's all-reduce is a comm span from launch to completion.
    """
    import time

    counter = {"calls": 0, "bytes": 0}

    def hook(state, bucket):
        counter["calls"] += 1
        counter["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        tensor = bucket.buffer().div_(dist.get_world_size(group))
        start, step = time.perf_counter(), timeline.current_step if timeline is not None else None

        def done(fut):
            if timeline is not None:
                timeline.add("comm", start, time.perf_counter(), name=f"bucket {bucket.index()}", step=step)
            return fut.value()[0]

        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(done)

    ddp_model.register_comm_hook(None, hook)
    return counter


def exposed_comm(timeline, summary: dict, mode: str) -> float:
    """Communication a step waits for (seconds, median over measured steps, mean over ranks), measured.

    ``naive`` and ``flat`` all-reduce after backward: all of their communication is exposed. ``bucket`` waits in
    ``finish_gradient_synchronization``: its ``wait`` span. DDP waits inside its backward (its reducer blocks at
    the end of autograd until every bucket is done), so no span of its own shows the wait: it is the time from
    the *last* bucket's launch — when autograd has produced the last gradient and compute is over — to the end
    of the backward span. Measured from the timeline, like the others, never assumed."""
    if mode in ("naive", "flat"):
        return summary["comm_time"]
    if mode == "bucket":
        return summary["wait_time"]
    if mode != "ddp":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    import numpy as np

    body = timeline[~timeline["warmup"].astype(bool) & (timeline["step"] >= 0)]
    tails = {}
    for (rank, _step), part in body.groupby(["rank", "step"]):
        comm, backward = part[part["kind"] == "comm"], part[part["kind"] == "backward"]
        if len(comm) and len(backward):
            tails.setdefault(rank, []).append(max(0.0, float(backward["end"].max() - comm["start"].max())))
    if not tails:
        raise ValueError("no DDP comm spans on the timeline: run with timeline=True (count_all_reduces adds them)")
    return float(np.mean([np.median(v) for v in tails.values()]))
