# exercise: zero3_linear
# kind: fool
# mistake: keeps the gathered full weight on ctx (an attribute, not save_for_backward) instead of re-gathering in backward: right numbers, but the whole weight stays resident between forward and backward (ZeRO-3's saving lost).
import torch
import torch.distributed as dist


class Zero3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight_shard):
        n = dist.get_world_size()
        weight = torch.empty(weight_shard.shape[0] * n, weight_shard.shape[1], dtype=weight_shard.dtype)
        dist.all_gather_into_tensor(weight, weight_shard.contiguous())
        ctx.save_for_backward(x, weight_shard)
        ctx.full = weight
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, weight_shard = ctx.saved_tensors
        n = dist.get_world_size()
        grad_x = grad_y @ ctx.full
        grad_shard = torch.empty_like(weight_shard)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_x, grad_shard / n


def zero3_linear(x, weight_shard):
    return Zero3Linear.apply(x, weight_shard)


ANSWER = zero3_linear
