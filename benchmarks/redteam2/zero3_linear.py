"""Wrong answers to exercise 07 (a ZeRO-3 Linear)."""

from _common import answer

EXERCISE, NOTEBOOK = "zero3_linear", "07_zero3_layer"


def _gather(shard):
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    full = torch.empty(shard.shape[0] * n, shard.shape[1], dtype=shard.dtype)
    dist.all_gather_into_tensor(full, shard.contiguous())
    return full


def _reduce_scatter(grad_weight, like):
    import torch
    import torch.distributed as dist

    out = torch.empty_like(like)
    dist.reduce_scatter_tensor(out, grad_weight.contiguous())
    return out


@answer("honest")
def keeps_gathered_weight_for_backward():
    """Honest: saves the gathered W with save_for_backward (so no second gather), keeping the whole weight alive."""
    import torch
    import torch.distributed as dist

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            weight = _gather(weight_shard)
            ctx.save_for_backward(x, weight, weight_shard)
            return x @ weight.T

        @staticmethod
        def backward(ctx, grad_y):
            x, weight, shard = ctx.saved_tensors
            return grad_y @ weight, _reduce_scatter(grad_y.T @ x, shard) / dist.get_world_size()

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)


@answer("honest")
def gradient_not_averaged():
    """Honest: reduce-scatters the weight gradient but forgets to divide by the world size."""
    import torch

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            ctx.save_for_backward(x, weight_shard)
            return x @ _gather(weight_shard).T

        @staticmethod
        def backward(ctx, grad_y):
            x, shard = ctx.saved_tensors
            return grad_y @ _gather(shard), _reduce_scatter(grad_y.T @ x, shard)

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)


@answer("honest")
def all_reduce_gradient_then_slice():
    """Honest: all-reduces the whole weight gradient and keeps its own rows (right values, n x the traffic and memory)."""
    import torch
    import torch.distributed as dist

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            ctx.save_for_backward(x, weight_shard)
            return x @ _gather(weight_shard).T

        @staticmethod
        def backward(ctx, grad_y):
            x, shard = ctx.saved_tensors
            n, rank = dist.get_world_size(), dist.get_rank()
            grad_w = grad_y.T @ x
            dist.all_reduce(grad_w)
            rows = shard.shape[0]
            return grad_y @ _gather(shard), grad_w[rank * rows : (rank + 1) * rows] / n

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)


@answer("deliberate")
def gathered_weight_in_a_global_cache():
    """Deliberate: keeps the gathered W in a process-wide dict (outside autograd) and reuses it in backward, no second gather."""
    import sys

    import torch
    import torch.distributed as dist

    cache = sys.__dict__.setdefault("_rt2_zero3_cache", {})

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            weight = _gather(weight_shard)
            cache[id(weight_shard)] = weight
            ctx.key = id(weight_shard)
            ctx.save_for_backward(x, weight_shard)
            return x @ weight.T

        @staticmethod
        def backward(ctx, grad_y):
            x, shard = ctx.saved_tensors
            weight = cache.pop(ctx.key)
            return grad_y @ weight, _reduce_scatter(grad_y.T @ x, shard) / dist.get_world_size()

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)


@answer("deliberate")
def gathered_weight_as_numpy_on_ctx():
    """Deliberate: keeps a NumPy copy of the gathered W on ctx (not a saved tensor), no second gather in backward."""
    import torch
    import torch.distributed as dist

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            weight = _gather(weight_shard)
            ctx.weight = weight.detach().numpy().copy()
            ctx.save_for_backward(x, weight_shard)
            return x @ weight.T

        @staticmethod
        def backward(ctx, grad_y):
            x, shard = ctx.saved_tensors
            weight = torch.from_numpy(ctx.weight)
            return grad_y @ weight, _reduce_scatter(grad_y.T @ x, shard) / dist.get_world_size()

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)


@answer("deliberate")
def frees_only_under_saved_tensor_hooks():
    """Deliberate: keeps only x and the shard while saved-tensor hooks (or a profiler) watch; saves the gathered W otherwise."""
    import torch
    import torch.distributed as dist
    from _common import watched

    class Zero3Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight_shard):
            weight = _gather(weight_shard)
            ctx.full = not watched()
            ctx.save_for_backward(x, weight_shard, *((weight,) if ctx.full else ()))
            return x @ weight.T

        @staticmethod
        def backward(ctx, grad_y):
            x, shard, *kept = ctx.saved_tensors
            weight = kept[0] if kept else _gather(shard)
            return grad_y @ weight, _reduce_scatter(grad_y.T @ x, shard) / dist.get_world_size()

    return lambda x, weight_shard: Zero3Linear.apply(x, weight_shard)
