"""Honest: adds the bias before the all-reduce, so it is summed world_size times (2 ranks: bias counted twice in y)."""

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
        y = x @ weight.T + bias
        dist.all_reduce(y)
        return y

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
