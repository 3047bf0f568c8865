"""Issue 33, family 5: memory weighed incompletely. Wrong ZeRO answers whose extra memory the grader did not see.

Each computes the right numbers and calls the right collectives; each holds memory the lesson says it must not:
state in NumPy (invisible to torch's profiler), the gathered weight kept on ``ctx`` (not through
``save_for_backward``), the weight saved in pieces each smaller than the whole.
"""

import numpy as np
import torch
import torch.distributed as dist

from planted.memory import _Base, _gather


class m5_numpy_moments(_Base):
    """ZeRO-1 right, plus a NumPy copy of every parameter's gradient and its square (kept between steps)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
        self.history = []

    @torch.no_grad()
    def step(self, closure=None):
        if not self.history:
            self.history = [(np.zeros(p.shape, np.float32), np.zeros(p.shape, np.float32)) for p in self.params]
        for (m, v), p in zip(self.history, self.params):
            g = p.grad.numpy()
            m += g
            v += g * g
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


class _WeightOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard):
        weight = _gather(shard)
        ctx.save_for_backward(x, shard)
        ctx.weight = weight  # kept alive from forward to backward, not through save_for_backward
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight = _gather(shard)  # gathered again, so the collectives look right
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_y @ weight, grad_shard / dist.get_world_size()


class _WeightInPieces(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard):
        weight = _gather(shard)
        pieces = [c.clone() for c in weight.chunk(dist.get_world_size())]  # each the size of a shard
        ctx.save_for_backward(x, shard, *pieces)
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, shard, *pieces = ctx.saved_tensors
        _gather(shard)  # gathered again, so the collectives look right
        weight = torch.cat(pieces)
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_y @ weight, grad_shard / dist.get_world_size()


def m5_weight_on_ctx(x, shard):
    return _WeightOnCtx.apply(x, shard)


def m5_weight_saved_in_pieces(x, shard):
    return _WeightInPieces.apply(x, shard)


SHARDED_OPTIMIZER = [m5_numpy_moments]
ZERO3_LINEAR = [m5_weight_on_ctx, m5_weight_saved_in_pieces]
HINTS = {"m5_numpy_moments": "NumPy", "m5_weight_on_ctx": "alive after forward", "m5_weight_saved_in_pieces": "in all"}
