"""Data parallelism, three ways: naive, one flat buffer, buckets overlapped with backward.

Every rank holds the whole model and a shard of the global batch; after backward the ranks average
their gradients, so each applies the same update and the replicas stay equal (Li et al. 2020, "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training", describes DDP's buckets and overlap;
picotron's data_parallel.py names the same progression).

    DataParallelNaive   one all_reduce per gradient, after backward         (many small messages)
    DataParallelFlat    copy all gradients into one buffer, one all_reduce  (one big message)
    DataParallelBucket  grad hooks fill buckets; each full bucket starts an async all_reduce while
                        backward goes on computing earlier layers            (overlap)

All three share one interface with ``torch.nn.parallel.DistributedDataParallel`` where it matters:
``forward``, ``no_sync()`` and ``require_backward_grad_sync``. Call ``finish_gradient_synchronization()``
after ``backward`` (DDP does the same from a callback at the end of backward).
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["broadcast_parameters", "DataParallelNaive", "DataParallelFlat", "DataParallelBucket",
           "make_buckets", "MODES", "wrap", "train_steps", "run_data_parallel", "reference_run"]


def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank, so all replicas start equal.

    ``src`` is a rank within ``group`` (default: the world).
    """
    src = dist.get_global_rank(group, src) if group is not None else src
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=src, group=group)


def _span(timeline, kind, name=None):
    return timeline.span(kind, name=name) if timeline is not None else nullcontext()


class _DataParallel(nn.Module):
    """What the three wrappers share: the module, the sync switch, ``no_sync``."""

    def __init__(self, module: nn.Module, timeline=None, group=None):
        super().__init__()
        self.module = module
        self.timeline = timeline
        self.group = group  # the data-parallel process group (default: the world)
        self.world_size = dist.get_world_size(group)
        self.require_backward_grad_sync = True  # DDP's name for the same switch
        broadcast_parameters(module, group=group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward inside this block only accumulates local gradients (no communication)."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.module.parameters() if p.grad is not None]


class DataParallelNaive(_DataParallel):
    """After backward: ``all_reduce`` every gradient on its own, then divide by ``world_size``."""

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        for i, grad in enumerate(self.grads()):
            with _span(self.timeline, "comm", f"all_reduce grad {i}"):
                dist.all_reduce(grad, group=self.group)  # sum over ranks ...
                grad /= self.world_size  # ... so divide: the mean gradient of the global batch


def all_reduce_mean_flat(tensors, group=None) -> None:
    """Average ``tensors`` over the ranks of ``group`` in place with one all-reduce of a flat buffer."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class DataParallelFlat(_DataParallel):
    """After backward: one ``all_reduce`` of all gradients packed in one flat buffer (one latency, not P)."""

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        with _span(self.timeline, "comm", "all_reduce flat"):
            all_reduce_mean_flat(self.grads(), group=self.group)


def make_buckets(params, bucket_cap_mb: float = 25.0) -> list[list[nn.Parameter]]:
    """Group parameters into buckets of about ``bucket_cap_mb`` MB, in reverse order.

    Reverse, because backward produces the last layer's gradients first: the first bucket fills first
    and its all-reduce can start while earlier layers are still being differentiated (DDP's default cap
    is 25 MB). A parameter bigger than the cap gets a bucket of its own.
    """
    cap = bucket_cap_mb * 2 ** 20
    buckets, current, size = [], [], 0
    for p in reversed([p for p in params if p.requires_grad]):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


class DataParallelBucket(_DataParallel):
    """Bucketed all-reduce, started from gradient hooks and overlapped with the rest of backward.

    Each parameter's ``post_accumulate_grad_hook`` copies its gradient into its bucket's flat buffer;
    when a bucket's last gradient arrives the bucket starts ``all_reduce(async_op=True)``. Backward
    goes on while the message is in flight; ``finish_gradient_synchronization`` waits for every
    handle and copies the averaged gradients back. With a timeline, each bucket's comm span runs from
    launch to completion (so it overlaps backward in the Gantt chart) and the final waiting is a wait span.
    Every parameter must receive a gradient each step (as DDP without ``find_unused_parameters``).
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, timeline=None, group=None):
        super().__init__(module, timeline, group)
        self.buckets = make_buckets(module.parameters(), bucket_cap_mb)
        self.buffers_ = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                         for b in self.buckets]
        self.where = {}  # param -> (bucket index, offset in its buffer)
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._reset()

    def _reset(self) -> None:
        self.pending = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self.handles = [None] * len(self.buckets)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self.require_backward_grad_sync:
            return  # accumulating locally (no_sync): communicate on the last micro-batch only
        i, offset = self.where[param]
        self.buffers_[i][offset:offset + param.numel()].copy_(param.grad.view(-1))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self.handles[i] = self._launch(i)

    def _launch(self, i: int):
        start = time.perf_counter()
        work = dist.all_reduce(self.buffers_[i], group=self.group, async_op=True)
        if self.timeline is not None:
            timeline, step = self.timeline, self.timeline.current_step

            def done(fut):  # runs when the all-reduce completes, on a communication thread
                timeline.add("comm", start, time.perf_counter(), name=f"bucket {i}", step=step)
                return fut.value()

            work.get_future().then(done)
        return work

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        missing = [i for i, h in enumerate(self.handles) if h is None]
        if missing:
            self._reset()
            raise RuntimeError(f"bucket(s) {missing} never filled: some parameters got no gradient this step "
                               "(unused in forward?) or backward was not run before finishing")
        with _span(self.timeline, "wait", "wait for buckets"):
            for work in self.handles:
                work.wait()
        for bucket, buffer in zip(self.buckets, self.buffers_):
            buffer /= self.world_size
            offset = 0
            for p in bucket:
                p.grad.copy_(buffer[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self._reset()


# ───────────────────────── one training loop for every variant ─────────────────────────

MODES = ("naive", "flat", "bucket", "ddp")


def wrap(model: nn.Module, mode: str, bucket_cap_mb: float = 25.0, timeline=None, group=None) -> nn.Module:
    """The data-parallel wrapper called ``mode`` (one of :data:`MODES`) over ``group`` (default: the world)."""
    if mode == "naive":
        return DataParallelNaive(model, timeline, group)
    if mode == "flat":
        return DataParallelFlat(model, timeline, group)
    if mode == "bucket":
        return DataParallelBucket(model, bucket_cap_mb, timeline, group)
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, process_group=group)
    raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")


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


def reference_run(steps: int = 3, global_batch: int = 64, width: int = 64, depth: int = 3, lr: float = 0.05,
                  seed: int = 0) -> dict:
    """The single-process run on the whole global batch that every data-parallel run must equal."""
    model, x, y = _setup(width, depth, global_batch, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = train_steps(model, opt, x, y, steps)
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def run_data_parallel(mode: str = "bucket", steps: int = 3, global_batch: int = 64, width: int = 64,
                      depth: int = 3, lr: float = 0.05, seed: int = 0, bucket_cap_mb: float = 25.0,
                      warmup: int = 0, timeline: bool = False) -> dict:
    """One rank of a data-parallel run (call on every rank): same model and data as :func:`reference_run`.

    Rank r trains on the r-th contiguous shard of the global batch. Returns this rank's final state,
    its losses, and with ``timeline=True`` the gathered timeline (every rank) and its summary.
    Outside a process group (or with one rank) it trains the plain model: the one-process measurement.
    """
    from ..models import shard
    from ..timeline import Timeline, summarize
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    model, x, y = _setup(width, depth, global_batch, seed)
    tl = Timeline(rank=rank, warmup=warmup) if timeline else None
    dp_model = wrap(model, mode, bucket_cap_mb, tl) if distributed else model
    if distributed and mode == "ddp" and tl is not None:  # DDP is opaque: a comm hook shows its buckets on the timeline
        from .accumulate import count_all_reduces
        count_all_reduces(dp_model, tl)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = train_steps(dp_model, opt, shard(x, rank, world_size), shard(y, rank, world_size), steps, tl)
    out = {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}
    if timeline:
        df = tl.gather()
        out["timeline"], out["summary"] = df, summarize(df)
    return out
