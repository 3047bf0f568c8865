"""Honest: grad_w = x.T @ grad_y (the textbook's layout for y = x W) instead of grad_y.T @ x for y = x W^T: the gradient comes back transposed (a shape error unless square, wrong otherwise)."""

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
        grad_w = x.reshape(-1, x.shape[-1]).T @ flat_grad
        return grad_x, grad_w, flat_grad.sum(0)


class RowParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = x @ weight.T
        dist.all_reduce(y)
        return y + bias

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
