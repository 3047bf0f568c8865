"""Honest: slices its own rows out of its local grad_W without any reduce: each rank's shard gets only its own batch's gradient, not the sum over ranks."""

import torch
import torch.distributed as dist


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
        grad_weight = grad_y.T @ x
        grad_shard = grad_weight.chunk(n)[dist.get_rank()]
        return grad_x, grad_shard / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
KIND = "honest"
PROVE = {"world_size": 2, "d_out": 6}
