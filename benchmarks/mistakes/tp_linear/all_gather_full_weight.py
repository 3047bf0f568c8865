"""Deliberate: all-gathers the full weight in every forward and backward and computes the unsplit layer on every rank: right numbers, but each rank holds the whole matrix and moves it (profiler: allgather)."""

import torch
import torch.distributed as dist


def _gather(t, dim):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


class ColumnParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        full_w, full_g = _gather(weight, 0), _gather(grad_y, -1)
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        return full_g @ full_w, flat_grad.T @ x.reshape(-1, x.shape[-1]), flat_grad.sum(0)


class RowParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return _gather(x, -1) @ _gather(weight, 1).T + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        return grad_y @ weight, flat_grad.T @ x.reshape(-1, x.shape[-1]), flat_grad.sum(0)


tp_linear = (ColumnParallelLinear, RowParallelLinear)


ANSWER = tp_linear
KIND = "deliberate"
PROVE = {"world_size": 2, "d_hidden": 8}
