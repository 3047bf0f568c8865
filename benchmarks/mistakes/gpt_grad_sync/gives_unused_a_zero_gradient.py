"""Honest: writes the averaged slice into every parameter, creating p.grad (a zero) where the forward did not use the parameter: the optimizer then decays and moves a parameter that had no gradient."""

import torch
import torch.distributed as dist
from torch import nn

from simlib.parallel.data import make_buckets


class BucketSync(nn.Module):
    def __init__(self, module, bucket_cap_mb=25.0, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.world_size = dist.get_world_size(group)
        self.buckets = make_buckets(module.parameters(), bucket_cap_mb)
        self.buffers = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype) for b in self.buckets]
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

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def on_grad_ready(self, param):
        i, offset = self.slot[param]
        self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self.handles[i] = dist.all_reduce(self.buffers[i], group=self.group, async_op=True)

    def finish_gradient_synchronization(self):
        for i, bucket in enumerate(self.buckets):
            if self.handles[i] is None:
                for p in bucket:
                    if p.grad is None:
                        j, offset = self.slot[p]
                        self.buffers[j][offset : offset + p.numel()].zero_()
                self.handles[i] = dist.all_reduce(self.buffers[i], group=self.group, async_op=True)
        for bucket, buffer, handle in zip(self.buckets, self.buffers, self.handles):
            handle.wait()
            buffer /= self.world_size
            offset = 0
            for p in bucket:
                p.grad = buffer[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        self.reset()


ANSWER = BucketSync
KIND = "honest"
PROVE = {"world_size": 2, "unused": True}
