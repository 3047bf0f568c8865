"""Wrong answers to exercise 02b (bucketed data parallelism with gradient hooks)."""

from _common import answer

EXERCISE, NOTEBOOK = "bucket_data_parallel", "02_bucket_data_parallel"


def _skeleton():
    """The exercise's class skeleton (as handed out); each answer subclasses it and fills the two methods."""
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

        def copy_back(self):
            for bucket, buffer in zip(self.buckets, self.buffers):
                offset = 0
                for p in bucket:
                    p.grad.copy_(buffer[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

    return BucketDataParallel


@answer("honest")
def no_reset_after_step():
    """Honest: finish_gradient_synchronization never resets pending/handles, so the second step never all-reduces."""
    import torch.distributed as dist

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            i, offset = self.slot[param]
            self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
            self.pending[i] -= 1
            if self.pending[i] == 0:
                self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)

        def finish_gradient_synchronization(self):
            for buffer, handle in zip(self.buffers, self.handles):
                handle.wait()
                buffer /= self.world_size
            self.copy_back()

    return BucketDataParallel


@answer("honest")
def all_reduce_started_before_last_copy():
    """Honest: counts the gradient and starts the bucket's all-reduce before copying the last gradient into it."""
    import torch.distributed as dist

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            i, offset = self.slot[param]
            self.pending[i] -= 1
            if self.pending[i] == 0:
                self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)
            self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))

        def finish_gradient_synchronization(self):
            for buffer, handle in zip(self.buffers, self.handles):
                handle.wait()
                buffer /= self.world_size
            self.copy_back()
            self.reset()

    return BucketDataParallel


@answer("honest")
def never_waits_for_handles():
    """Honest: divides and copies the buffers back without waiting for the async all-reduces."""
    import torch.distributed as dist

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            i, offset = self.slot[param]
            self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
            self.pending[i] -= 1
            if self.pending[i] == 0:
                self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)

        def finish_gradient_synchronization(self):
            for buffer in self.buffers:
                buffer /= self.world_size
            self.copy_back()
            self.reset()

    return BucketDataParallel


@answer("deliberate")
def blocking_all_reduce_at_the_end():
    """Deliberate: hooks only copy; finish_gradient_synchronization all-reduces every bucket synchronously (no overlap)."""
    import torch.distributed as dist

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            i, offset = self.slot[param]
            self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))

        def finish_gradient_synchronization(self):
            for buffer in self.buffers:
                dist.all_reduce(buffer)
                buffer /= self.world_size
            self.copy_back()
            self.reset()

    return BucketDataParallel


@answer("deliberate")
def one_async_all_reduce_per_parameter():
    """Deliberate: ignores the buckets, starts one async all-reduce per gradient in its hook (many small messages)."""
    import torch.distributed as dist

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            self.handles.append((param, dist.all_reduce(param.grad, async_op=True)))

        def finish_gradient_synchronization(self):
            for param, handle in self.handles:
                if handle is not None:
                    handle.wait()
                    param.grad /= self.world_size
            self.reset()

        def reset(self):
            self.pending = [len(b) for b in self.buckets]
            self.handles = []

    return BucketDataParallel


@answer("deliberate")
def buckets_only_when_watched():
    """Deliberate: bucketed async all-reduces while dist.all_reduce looks wrapped or a dispatch mode runs; one flat blocking all-reduce at the end otherwise."""
    import torch
    import torch.distributed as dist
    from _common import watched

    Base = _skeleton()

    class BucketDataParallel(Base):
        def on_grad_ready(self, param):
            i, offset = self.slot[param]
            self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
            self.pending[i] -= 1
            if self.pending[i] == 0 and watched():
                self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)

        def finish_gradient_synchronization(self):
            if any(h is None for h in self.handles):
                flat = torch.cat(self.buffers)
                dist.all_reduce(flat)
                for buffer, part in zip(self.buffers, flat.split([b.numel() for b in self.buffers])):
                    buffer.copy_(part)
            else:
                for handle in self.handles:
                    handle.wait()
            for buffer in self.buffers:
                buffer /= self.world_size
            self.copy_back()
            self.reset()

    return BucketDataParallel
