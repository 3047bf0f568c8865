"""Honest: averages the partial products (all-reduce then / world_size, as for gradients in data parallelism): the row layer's output must be their sum (2 ranks: half)."""

import torch
import torch.distributed as dist


class ColumnParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_x = grad_y @ weight
        dist.all_reduce(grad_x)
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        grad_w = flat_grad.T @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, flat_grad.sum(0)


class RowParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = x @ weight.T
        dist.all_reduce(y)
        return y / dist.get_world_size() + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        grad_w = flat_grad.T @ x.reshape(-1, x.shape[-1])
        return grad_y @ weight, grad_w, flat_grad.sum(0)


tp_linear = (ColumnParallelLinear, RowParallelLinear)


ANSWER = tp_linear
KIND = "honest"
PROVE = {"world_size": 2, "d_hidden": 8}
