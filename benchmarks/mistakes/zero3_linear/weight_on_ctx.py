"""Honest: keeps the gathered W as ctx.weight ('saved tensors are for inputs') and reuses it in backward: the full matrix is held between forward and backward all the same."""

import torch
import torch.distributed as dist


class Zero3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight_shard):
        n = dist.get_world_size()
        weight = torch.empty(weight_shard.shape[0] * n, weight_shard.shape[1], dtype=weight_shard.dtype)
        dist.all_gather_into_tensor(weight, weight_shard.contiguous())
        ctx.save_for_backward(x, weight_shard)
        ctx.weight = weight
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, weight_shard = ctx.saved_tensors
        n = dist.get_world_size()
        weight = ctx.weight
        grad_x = grad_y @ weight
        grad_weight = grad_y.T @ x
        grad_shard = torch.empty_like(weight_shard)
        dist.reduce_scatter_tensor(grad_shard, grad_weight.contiguous())
        return grad_x, grad_shard / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
KIND = "honest"
PROVE = {"world_size": 2, "d_out": 6}
