"""Honest: copies the summed buffer back without dividing by world_size: gradients are the sum over ranks (2 ranks: twice the step)."""

import torch
import torch.distributed as dist

from simlib.parallel.data import broadcast_parameters, make_buckets


class BucketDataParallel(torch.nn.Module):
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

    def finish_gradient_synchronization(self):
        for bucket, buffer, handle in zip(self.buckets, self.buffers, self.handles):
            handle.wait()
            offset = 0
            for p in bucket:
                p.grad.copy_(buffer[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.reset()


ANSWER = BucketDataParallel
KIND = "honest"
PROVE = {"world_size": 2, "steps": 2}
