"""Wrong answers to exercise 07 (ZeRO-1: the sharded optimizer)."""

from _common import answer

EXERCISE, NOTEBOOK = "sharded_optimizer", "07_sharded_optimizer"


def _base():
    """The skeleton handed out: partition and the first lines of __init__."""
    import torch
    import torch.distributed as dist

    def partition(numels, world_size):
        load, owner = [0] * world_size, [0] * len(numels)
        for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
            r = min(range(world_size), key=lambda r: (load[r], r))
            owner[i], load[r] = r, load[r] + numels[i]
        return owner

    class Base(torch.optim.Optimizer):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, kwargs)
            self.params = [p for g in self.param_groups for p in g["params"]]
            self.owner = partition([p.numel() for p in self.params], dist.get_world_size())

    return Base


@answer("honest")
def every_rank_steps_every_parameter():
    """Honest: builds the inner optimizer over all parameters on every rank (replicated state, nothing sharded)."""
    import torch

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            self.inner = optimizer_cls(self.params, **kwargs)

        @torch.no_grad()
        def step(self, closure=None):
            self.inner.step()

    return ShardedOptimizer


@answer("honest")
def broadcast_from_rank_zero():
    """Honest: steps its own shard but broadcasts every parameter from rank 0 instead of from its owner."""
    import torch
    import torch.distributed as dist

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            mine = [p for p, r in zip(self.params, self.owner) if r == dist.get_rank()]
            self.inner = optimizer_cls(mine, **kwargs) if mine else None

        @torch.no_grad()
        def step(self, closure=None):
            if self.inner is not None:
                self.inner.step()
            for p in self.params:
                dist.broadcast(p.data, src=0)

    return ShardedOptimizer


@answer("honest")
def round_robin_shard_owner_broadcast():
    """Honest: steps parameters i % n == rank (round-robin) but broadcasts from partition()'s owner."""
    import torch
    import torch.distributed as dist

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            n, rank = dist.get_world_size(), dist.get_rank()
            mine = [p for i, p in enumerate(self.params) if i % n == rank]
            self.inner = optimizer_cls(mine, **kwargs) if mine else None

        @torch.no_grad()
        def step(self, closure=None):
            if self.inner is not None:
                self.inner.step()
            for p, r in zip(self.params, self.owner):
                dist.broadcast(p.data, src=r)

    return ShardedOptimizer


def _adamw_kwargs(kwargs):
    lr = float(kwargs.get("lr", 1e-3))
    b1, b2 = kwargs.get("betas", (0.9, 0.999))
    return lr, float(b1), float(b2), float(kwargs.get("eps", 1e-8)), float(kwargs.get("weight_decay", 1e-2))


@answer("deliberate")
def numpy_adamw_on_every_rank():
    """Deliberate: every rank runs AdamW over all parameters with its moments in NumPy arrays (invisible to torch)."""
    import numpy as np
    import torch

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            self.hyper = _adamw_kwargs(kwargs)
            self.moments = None
            self.t = 0

        @torch.no_grad()
        def step(self, closure=None):
            lr, b1, b2, eps, wd = self.hyper
            if self.moments is None:
                self.moments = [(np.zeros(p.shape, np.float32), np.zeros(p.shape, np.float32)) for p in self.params]
            self.t += 1
            for p, (m, v) in zip(self.params, self.moments):
                if p.grad is None:
                    continue
                g = p.grad.numpy()
                w = p.data.numpy()
                w *= np.float32(1 - lr * wd)
                m *= np.float32(b1)
                m += np.float32(1 - b1) * g
                v *= np.float32(b2)
                v += np.float32(1 - b2) * g * g
                denom = np.sqrt(v) / np.float32(np.sqrt(1 - b2**self.t)) + np.float32(eps)
                w -= np.float32(lr / (1 - b1**self.t)) * m / denom

    return ShardedOptimizer


@answer("deliberate")
def full_state_allocated_in_init():
    """Deliberate: allocates the full (unsharded) Adam moments in __init__, outside step(), and updates every parameter in place."""
    import math

    import torch

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            self.hyper = _adamw_kwargs(kwargs)
            self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]
            self.t = 0

        @torch.no_grad()
        def step(self, closure=None):
            lr, b1, b2, eps, wd = self.hyper
            self.t += 1
            c1, c2 = 1 - b1**self.t, math.sqrt(1 - b2**self.t)
            for p, (m, v) in zip(self.params, self.moments):
                if p.grad is None:
                    continue
                p.mul_(1 - lr * wd)
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.addcdiv_(m, v.sqrt().div_(c2).add_(eps), value=-lr / c1)

    return ShardedOptimizer


@answer("deliberate")
def sharded_only_under_the_profiler():
    """Deliberate: the sharded step while torch's profiler runs (when memory is weighed); full AdamW on every rank otherwise."""
    import torch
    import torch.distributed as dist
    from _common import watched

    Base = _base()

    class ShardedOptimizer(Base):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            mine = [p for p, r in zip(self.params, self.owner) if r == dist.get_rank()]
            self.inner = optimizer_cls(mine, **kwargs) if mine else None
            self.everything = optimizer_cls(self.params, **kwargs)

        @torch.no_grad()
        def step(self, closure=None):
            if not watched():
                return self.everything.step()
            if self.inner is not None:
                self.inner.step()
            for p, r in zip(self.params, self.owner):
                dist.broadcast(p.data, src=r)

    return ShardedOptimizer
