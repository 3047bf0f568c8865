"""Wrong bucketed data parallelism (same skeleton as the exercise)."""

import torch
import torch.distributed as dist

from simlib.parallel.data import broadcast_parameters, make_buckets


class _Skeleton(torch.nn.Module):
    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_parameters(module)
        self.buckets = make_buckets(module.parameters(), bucket_cap_mb)
        self.buffers = [torch.zeros(sum(p.numel() for p in b)) for b in self.buckets]
        self.slot = {}
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.slot[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self.on_grad_ready)
        self.reset()

    def reset(self):
        self.pending = [len(b) for b in self.buckets]
        self.handles = [None] * len(self.buckets)

    def forward(self, *args):
        return self.module(*args)

    def on_grad_ready(self, param):
        i, offset = self.slot[param]
        self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)

    def _copy_back(self, divide=True):
        for bucket, buffer, handle in zip(self.buckets, self.buffers, self.handles):
            handle.wait()
            if divide:
                buffer /= self.world_size
            offset = 0
            for p in bucket:
                p.grad.copy_(buffer[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def finish_gradient_synchronization(self):
        self._copy_back()
        self.reset()


class PerParameterBlocking(_Skeleton):
    """One blocking all_reduce per gradient from the hook: correct, but no buckets and no overlap."""

    def on_grad_ready(self, param):
        dist.all_reduce(param.grad)
        param.grad /= self.world_size

    def finish_gradient_synchronization(self):
        pass


class AllReduceAfterBackward(_Skeleton):
    """Fills the buckets in the hooks but sends them only after backward: no overlap."""

    def on_grad_ready(self, param):
        i, offset = self.slot[param]
        self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))

    def finish_gradient_synchronization(self):
        self.handles = [dist.all_reduce(b, async_op=True) for b in self.buffers]
        self._copy_back()
        self.reset()


class NoDivide(_Skeleton):
    """Sums instead of averaging."""

    def finish_gradient_synchronization(self):
        self._copy_back(divide=False)
        self.reset()


class NoReset(_Skeleton):
    """Forgets to reset the pending counts: the second step never launches its all-reduces."""

    def finish_gradient_synchronization(self):
        self._copy_back()


class DividesTwice(_Skeleton):
    def finish_gradient_synchronization(self):
        for buffer, handle in zip(self.buffers, self.handles):
            handle.wait()
            buffer /= self.world_size  # once here, once more in _copy_back
        self._copy_back()
        self.reset()


class PowerOfTwoWorldSize(_Skeleton):
    """Divides by the largest power of two <= world size: right on 2 and 4 ranks, not on 3."""

    def finish_gradient_synchronization(self):
        self.world_size = 1 << (dist.get_world_size().bit_length() - 1)
        self._copy_back()
        self.reset()


class WaitsAtOnce(_Skeleton):
    """Buckets, async_op=True and all, but waits on each handle right in the hook: the numbers are right, the
    overlap (the point of the exercise) is gone. Passed the call-shape check of issue 47."""

    def on_grad_ready(self, param):
        super().on_grad_ready(param)
        i, _ = self.slot[param]
        if self.pending[i] == 0:
            self.handles[i].wait()


class DecoyAsync(_Skeleton):
    """Starts an async all-reduce of a dummy tensor in the hook (the call shape of overlap), then all-reduces the
    real bucket blocking, right away (issue 47: a decoy async all-reduce satisfied the overlap check)."""

    def on_grad_ready(self, param):
        i, offset = self.slot[param]
        self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self.handles[i] = dist.all_reduce(torch.zeros(1), async_op=True)  # the decoy
            dist.distributed_c10d.all_reduce(self.buffers[i])  # the real one, blocking, by its module path


class CountedBelowTheName(_Skeleton):
    """One all-reduce per bucket through torch.distributed.distributed_c10d, plus an extra all-reduce per parameter
    through the same path: a spy on dist.all_reduce (the name) saw only the buckets (issue 47)."""

    def on_grad_ready(self, param):
        dist.distributed_c10d.all_reduce(torch.zeros(1))  # an extra collective, not through the name dist.all_reduce
        super().on_grad_ready(param)


PLANTED = [
    PerParameterBlocking,
    AllReduceAfterBackward,
    NoDivide,
    NoReset,
    DividesTwice,
    PowerOfTwoWorldSize,
    WaitsAtOnce,
    DecoyAsync,
    CountedBelowTheName,
]
