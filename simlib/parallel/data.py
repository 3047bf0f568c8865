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
``forward``, ``no_sync()``, ``require_backward_grad_sync``, ``process_group`` (``group=``: the data-parallel
group, every rank by default) and ``find_unused_parameters``. Call ``finish_gradient_synchronization()``
after ``backward`` (DDP does the same from a callback at the end of backward).

No silent wrong answers. Averaging pairs each rank's gradient with the same parameter's gradient on every
other rank, so the wrappers check that the ranks agree on which parameters got a gradient this step (a
branch taken on some ranks only, a mixture of experts). Without ``find_unused_parameters=True`` a mismatch
raises, naming the ranks and the parameters; with it, a parameter without a gradient on a rank takes part
with a zero gradient (what DDP does). Several ``backward()`` calls before one finish accumulate, as in plain
PyTorch and in DDP (the bucketed wrapper then re-sends its buckets: use ``no_sync()`` to send once).
Buckets hold one dtype each, so a bf16 parameter never rounds an fp32 gradient.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "broadcast_parameters",
    "DataParallelNaive",
    "DataParallelFlat",
    "DataParallelBucket",
    "make_buckets",
    "MODES",
    "wrap",
]


def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank of ``group``, so all replicas start equal.

    ``src`` is a rank *within* ``group`` (world by default): 0 is the group's first member, whatever its
    global rank (with a data-parallel group of a 2-D mesh, global rank 0 is usually not a member).
    """
    src_global = dist.get_global_rank(group, src) if group is not None else src
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=src_global, group=group)


def _span(timeline, kind, name=None):
    return timeline.span(kind, name=name) if timeline is not None else nullcontext()


REMEDY = (
    "pass find_unused_parameters=True (a parameter without a gradient on a rank then takes part with a "
    "zero gradient, as in DDP), or freeze the parameters no rank uses (p.requires_grad_(False))"
)


class _DataParallel(nn.Module):
    """What the three wrappers share: the module, the group, the sync switch, ``no_sync``, the agreement check."""

    def __init__(self, module: nn.Module, timeline=None, group=None, find_unused_parameters: bool = False):
        super().__init__()
        self.module = module
        self.timeline = timeline
        self.group = self.process_group = group  # the data-parallel process group (None: the whole world)
        self.world_size = dist.get_world_size(group)  # the data-parallel size: what the sum is divided by
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True  # DDP's name for the same switch
        self.names = {p: n for n, p in module.named_parameters() if p.requires_grad}
        self.params = list(self.names)  # model order; frozen parameters take no part (as in DDP)
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
        return [p.grad for p in self.params if p.grad is not None]

    def _check_agreement(self, counts: torch.Tensor, missing: list[bool], what: str) -> None:
        """``counts[j]``: on how many ranks parameter j got no gradient (all-reduced). Raise on a mismatch.

        Every rank sees the same counts, so every rank takes the same path (the naming all_gather included).
        """
        counts = counts.round().long().tolist()
        partly = [j for j, c in enumerate(counts) if 0 < c < self.world_size]
        nowhere = [j for j, c in enumerate(counts) if c == self.world_size] if what == "bucket" else []
        if self.find_unused_parameters or not (partly or nowhere):
            return
        device = self.params[0].device if self.params else torch.device("cpu")
        mine = torch.tensor(missing, dtype=torch.uint8, device=device)  # NCCL: on the GPU
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self.group)
        ranks = [dist.get_global_rank(self.group, r) if self.group is not None else r for r in range(self.world_size)]
        names = [self.names[self.params[j]] for j in (partly or nowhere)]
        if partly:
            groups = {}  # (ranks without, ranks with) -> parameter names
            for j in partly:
                without = tuple(ranks[r] for r, m in enumerate(gathered) if m[j])
                with_ = tuple(ranks[r] for r, m in enumerate(gathered) if not m[j])
                groups.setdefault((without, with_), []).append(self.names[self.params[j]])
            detail = "; ".join(
                f"{names} got none on rank(s) {list(without)} but did on rank(s) {list(with_)}"
                for (without, with_), names in groups.items()
            )
            raise RuntimeError(
                "some parameters got a gradient on some ranks only this step (a branch taken on some ranks only? "
                f"a mixture of experts?): {detail}. Averaging would pair each rank's gradients with the wrong "
                f"partners. To fix: {REMEDY}"
            )
        buckets = sorted({self.where[self.params[j]][0] for j in nowhere})
        raise RuntimeError(
            f"bucket(s) {buckets} never filled: parameter(s) {names} got no gradient on any rank this step "
            f"(unused in forward? or backward was not run before finishing). To fix: {REMEDY}"
        )

    def _missing(self) -> list[bool]:
        return [p.grad is None for p in self.params]

    def _set_mean(self, p: nn.Parameter, summed: torch.Tensor) -> None:
        """``p.grad`` = ``summed`` / world size: the division writes straight into the gradient (one pass over
        the memory, not a division of the buffer and then a copy)."""
        summed = summed.view_as(p)
        if p.grad is None:
            p.grad = summed / self.world_size
        elif p.grad.dtype == summed.dtype:
            torch.div(summed, self.world_size, out=p.grad)
        else:
            p.grad.copy_(summed / self.world_size)


class DataParallelNaive(_DataParallel):
    """After backward: ``all_reduce`` every gradient on its own, then divide by ``world_size``.

    One tiny message first: how many ranks hold no gradient for each parameter (so that no gradient is
    ever summed with another parameter's); then one message per gradient.
    """

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        missing = self._missing()
        device = self.params[0].device if self.params else torch.device("cpu")
        counts = torch.tensor(missing, dtype=torch.float32, device=device)  # NCCL: on the GPU
        with _span(self.timeline, "comm", "all_reduce which grads are None"):
            dist.all_reduce(counts, group=self.group)
        counts = counts.cpu()  # read once here, not one device sync per parameter
        self._check_agreement(counts, missing, "naive")
        for i, p in enumerate(self.params):
            if counts[i] == self.world_size:
                continue  # no rank has a gradient for it: nothing to average
            grad = p.grad if p.grad is not None else torch.zeros_like(p)  # find_unused_parameters: a zero
            with _span(self.timeline, "comm", f"all_reduce grad {i}"):
                dist.all_reduce(grad, group=self.group)  # sum over ranks ...
                grad /= self.world_size  # ... so divide: the mean gradient of the global batch
            if p.grad is None:
                p.grad = grad


def all_reduce_mean_flat(tensors, group=None) -> None:
    """Average ``tensors`` over the ranks of ``group`` in place with one all-reduce of a flat buffer."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class DataParallelFlat(_DataParallel):
    """After backward: one ``all_reduce`` of all gradients packed in one flat buffer (one latency, not P).

    Every parameter has its place in the buffer (a zero where a rank has no gradient), and one more slot per
    parameter counts the ranks without one, so the ranks' agreement is checked in the same message.
    """

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        missing = self._missing()
        total = sum(p.numel() for p in self.params)
        if getattr(self, "_flat", None) is None:  # one buffer for every step: no allocation (and page faults) per step
            dtype = functools.reduce(torch.promote_types, [p.dtype for p in self.params], torch.float32)
            device = self.params[0].device if self.params else torch.device("cpu")
            self._flat = torch.empty(total + len(self.params), dtype=dtype, device=device)
        flat, offset = self._flat, 0
        for p in self.params:  # pack: a zero where this rank has no gradient
            view = flat[offset : offset + p.numel()]
            view.copy_(p.grad.reshape(-1)) if p.grad is not None else view.zero_()
            offset += p.numel()
        flat[total:] = torch.tensor(missing, dtype=flat.dtype, device=flat.device)
        with _span(self.timeline, "comm", "all_reduce flat"):
            dist.all_reduce(flat, group=self.group)
        counts = flat[total:].float().cpu().clone()
        self._check_agreement(counts, missing, "flat")
        offset = 0
        for p, count in zip(self.params, counts):
            if count < self.world_size:
                self._set_mean(p, flat[offset : offset + p.numel()])
            offset += p.numel()


def make_buckets(params, bucket_cap_mb: float = 25.0) -> list[list[nn.Parameter]]:
    """Group parameters into buckets of about ``bucket_cap_mb`` MB, in reverse order, one dtype per bucket.

    Reverse, because backward produces the last layer's gradients first: the first bucket fills first
    and its all-reduce can start while earlier layers are still being differentiated (DDP's default cap
    is 25 MB). A parameter bigger than the cap gets a bucket of its own. Parameters of different dtypes
    (or devices) never share a bucket (as in DDP): a bucket's buffer has one dtype, and an fp32 gradient
    copied into a bf16 buffer would be rounded.
    """
    cap = bucket_cap_mb * 2**20
    buckets, open_ = [], {}  # (dtype, device) -> [parameters, bytes] of the bucket being filled
    for p in reversed([p for p in params if p.requires_grad]):
        key, nbytes = (p.dtype, p.device), p.numel() * p.element_size()
        current = open_.get(key)
        if current and current[0] and current[1] + nbytes > cap:
            buckets.append(current[0])
            current = None
        if current is None:
            current = open_[key] = [[], 0]
        current[0].append(p)
        current[1] += nbytes
    buckets += [b for b, _ in open_.values() if b]
    return buckets


class DataParallelBucket(_DataParallel):
    """Bucketed all-reduce, started from gradient hooks and overlapped with the rest of backward.

    Each parameter's ``post_accumulate_grad_hook`` copies its gradient into its bucket's flat buffer;
    when a bucket's last gradient arrives the bucket starts ``all_reduce(async_op=True)``, in bucket order
    (as DDP: every rank then issues the same messages in the same order). Backward goes on while the message
    is in flight; ``finish_gradient_synchronization`` sends what backward did not fill (parameters without a
    gradient this step: their current gradient or a zero, then the agreement check below), waits for every
    handle and copies the averaged gradients back. The last bucket also carries one count per parameter: on
    how many ranks it got no gradient (so the check costs no extra message). A second ``backward()`` before
    finishing (accumulation without ``no_sync``) re-sends the buckets with the accumulated gradients.
    With a timeline, each bucket's comm span runs from launch to completion (so it overlaps backward in the
    Gantt chart) and the final waiting is a wait span.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_cap_mb: float = 25.0,
        timeline=None,
        group=None,
        find_unused_parameters: bool = False,
    ):
        super().__init__(module, timeline, group, find_unused_parameters)
        self.buckets = make_buckets(self.params, bucket_cap_mb)
        if not self.buckets or self.buckets[-1][0].dtype not in (torch.float32, torch.float64):
            self.buckets.append([])  # the counts ride in a float32 bucket of their own (exact integers)
        self.index = {p: j for j, p in enumerate(self.params)}
        self.where = {}  # param -> (bucket index, offset in its buffer)
        self.buffers_ = []
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
            extra = len(self.params) if i == len(self.buckets) - 1 else 0  # the counts, in the last bucket
            like = bucket[0] if bucket else torch.empty(0, device=self.params[0].device if self.params else "cpu")
            self.buffers_.append(torch.zeros(offset + extra, dtype=like.dtype, device=like.device))
        self._new_step()

    # ── state of one step: which parameters got a gradient, which are packed, which buckets are sent ──
    def _new_step(self) -> None:
        self.used = set()  # parameters whose gradient arrived since the last finish (in no_sync too)
        self._end_queued = False  # a callback will run at the end of the current backward
        self._backward_ended = False  # a backward ended since packing began
        self._stale = False  # a gradient changed after it was packed (backward under no_sync after a synced one)
        self._new_packing()

    def _new_packing(self) -> None:
        self.packed = [set() for _ in self.buckets]
        self.handles = [None] * len(self.buckets)
        self.next_launch = 0  # buckets go out in order

    def _restart_packing(self) -> None:
        """Gradients changed after buckets were sent: let those messages finish, then pack again from scratch."""
        for work in self.handles:
            if work is not None:
                work.wait()
        self._new_packing()
        self._stale = False

    def _on_backward_end(self) -> None:
        self._end_queued = False
        self._backward_ended = True

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        self.used.add(param)
        if not self._end_queued:  # as DDP: learn when this backward ends, to tell a second backward apart
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._end_queued = True
        anything_packed = any(self.packed) or self.next_launch > 0
        if not self.require_backward_grad_sync:  # accumulating locally (no_sync): communicate later
            self._stale |= anything_packed
            return
        if self._backward_ended:  # a second backward before finishing: the sent buckets are out of date
            if anything_packed:
                self._restart_packing()
            self._backward_ended = False
        self._pack(param)
        self._launch_ready()

    def _pack(self, p: nn.Parameter) -> None:
        i, offset = self.where[p]
        view = self.buffers_[i][offset : offset + p.numel()]
        view.copy_(p.grad.view(-1)) if p.grad is not None else view.zero_()
        self.packed[i].add(p)

    def _launch_ready(self) -> None:
        while self.next_launch < len(self.buckets) and len(self.packed[self.next_launch]) == len(
            self.buckets[self.next_launch]
        ):
            i = self.next_launch
            if i == len(self.buckets) - 1:  # the counts: on this rank, the parameters without a gradient
                n = len(self.params)
                self.buffers_[i][-n:] = torch.tensor(self._missing_mask(), dtype=self.buffers_[i].dtype)
            self.handles[i] = self._launch(i)
            self.next_launch += 1

    def _missing_mask(self) -> list[bool]:
        return [p not in self.used for p in self.params]

    def _launch(self, i: int):
        with _span(self.timeline, "comm", f"bucket {i} issue"):  # in backward: the main thread does not compute
            work = dist.all_reduce(self.buffers_[i], group=self.group, async_op=True)
        start = time.perf_counter()
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
        if self._stale:
            self._restart_packing()
        missing = self._missing_mask()
        for i, bucket in enumerate(self.buckets):  # what backward did not send: same messages on every rank
            for p in bucket:
                if p not in self.packed[i]:
                    self._pack(p)
        self._launch_ready()
        with _span(self.timeline, "wait", "wait for buckets"):
            for work in self.handles:
                work.wait()
        n = len(self.params)
        counts = self.buffers_[-1][-n:].float().cpu().clone()
        try:
            self._check_agreement(counts, missing, "bucket")
        finally:
            self._new_step()
        for bucket, buffer in zip(self.buckets, self.buffers_):
            offset = 0
            for p in bucket:
                if counts[self.index[p]] < self.world_size or p.grad is not None:
                    self._set_mean(p, buffer[offset : offset + p.numel()])
                offset += p.numel()


# ───────────────────────── every variant by name ─────────────────────────

MODES = ("naive", "flat", "bucket", "ddp")


def wrap(
    model: nn.Module,
    mode: str,
    bucket_cap_mb: float = 25.0,
    timeline=None,
    group=None,
    find_unused_parameters: bool = False,
) -> nn.Module:
    """The data-parallel wrapper called ``mode`` (one of :data:`MODES`) over the process group ``group``.

    ``group`` is the data-parallel group (None: every rank), e.g. ``Mesh(dp=2, tp=2).build().dp_group`` when
    data parallelism is composed with tensor or pipeline parallelism. ``find_unused_parameters=True``: a
    parameter that gets no gradient on some ranks takes part with a zero gradient (without it: an error
    naming the ranks and parameters).
    """
    unused = dict(group=group, find_unused_parameters=find_unused_parameters)
    if mode == "naive":
        return DataParallelNaive(model, timeline, **unused)
    if mode == "flat":
        return DataParallelFlat(model, timeline, **unused)
    if mode == "bucket":
        return DataParallelBucket(model, bucket_cap_mb, timeline, **unused)
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=bucket_cap_mb, process_group=group, find_unused_parameters=find_unused_parameters
        )
    raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")
