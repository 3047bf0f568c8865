"""Honest: gathers the shards side by side (dim 1) as torch.cat(parts, dim=1) would: W comes out (out/N, N*in), not (out, in) (a shape error in x @ W.T)."""

import torch
import torch.distributed as dist


def _gather(shard):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts, dim=1)


class Zero3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight_shard):
        ctx.save_for_backward(x, weight_shard)
        return x @ _gather(weight_shard).T

    @staticmethod
    def backward(ctx, grad_y):
        x, weight_shard = ctx.saved_tensors
        n = dist.get_world_size()
        grad_x = grad_y @ _gather(weight_shard)
        grad_weight = grad_y.T @ x
        grad_shard = torch.empty_like(weight_shard)
        dist.reduce_scatter_tensor(grad_shard, grad_weight.contiguous())
        return grad_x, grad_shard / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
KIND = "honest"
PROVE = {"world_size": 2, "d_out": 6}
