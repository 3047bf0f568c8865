"""Honest: all-gathers every rank's whole weight gradient and sums the gathered copies, keeping its own rows: the right values, but each rank sends its whole gradient to every other rank ((n-1) whole gradients, against a reduce-scatter's share) - on 3 and 4 ranks, more than the exercise's collectives move."""

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
        n, rank = dist.get_world_size(), dist.get_rank()
        weight = torch.empty(weight_shard.shape[0] * n, weight_shard.shape[1], dtype=weight_shard.dtype)
        dist.all_gather_into_tensor(weight, weight_shard.contiguous())
        grad_x = grad_y @ weight
        grad_weight = (grad_y.T @ x).contiguous()
        every = [torch.empty_like(grad_weight) for _ in range(n)]
        dist.all_gather(every, grad_weight)
        total = torch.stack(every).sum(0)
        return grad_x, total.chunk(n)[rank] / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
KIND = "honest"
PROVE = {"world_size": 3, "d_out": 6}
