# exercise: zero3_linear
# kind: honest
# mistake: all-reduces the full weight gradient and slices out its own rows instead of a reduce-scatter: right numbers, twice the traffic and a full-size gradient on every rank.
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
        dist.all_reduce(grad_weight)
        s = weight_shard.shape[0]
        return grad_x, grad_weight[rank * s : (rank + 1) * s] / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
