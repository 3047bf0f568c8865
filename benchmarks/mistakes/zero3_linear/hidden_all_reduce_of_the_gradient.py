"""Deliberate: the exercise's collectives where any counter can see them (one all-gather in forward, one all-gather and one reduce-scatter in backward), plus an all-reduce of the whole weight gradient with torch's dispatch modes switched off (torch.utils._python_dispatch._disable_current_modes), out of sight of every counter in its process: the right values and the right call counts, but the whole gradient crosses the wire once more."""

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes


class Zero3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight_shard):
        n = dist.get_world_size()
        weight = torch.empty(weight_shard.shape[0] * n, weight_shard.shape[1], dtype=weight_shard.dtype)
        dist.all_gather_into_tensor(weight, weight_shard.contiguous())
        ctx.save_for_backward(x, weight_shard)
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, weight_shard = ctx.saved_tensors
        n = dist.get_world_size()
        weight = torch.empty(weight_shard.shape[0] * n, weight_shard.shape[1], dtype=weight_shard.dtype)
        dist.all_gather_into_tensor(weight, weight_shard.contiguous())
        grad_x = grad_y @ weight
        grad_weight = (grad_y.T @ x).contiguous()
        with _disable_current_modes():
            dist.all_reduce(grad_weight.clone())
        grad_shard = torch.empty_like(weight_shard)
        dist.reduce_scatter_tensor(grad_shard, grad_weight)
        return grad_x, grad_shard / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
KIND = "deliberate"
PROVE = {"world_size": 2, "d_out": 6}
