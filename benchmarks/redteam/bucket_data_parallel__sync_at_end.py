# exercise: bucket_data_parallel
# kind: fool
# mistake: hooks do nothing; finish_gradient_synchronization all-reduces every gradient one by one, synchronously, after backward: right numbers, but no buckets and no overlap with backward (the point of the exercise).
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
        pass

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world_size
        self.reset()


ANSWER = BucketDataParallel
