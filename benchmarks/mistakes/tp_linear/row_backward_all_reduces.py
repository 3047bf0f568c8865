"""Honest: all-reduces grad_x in the row layer's backward too ('backward mirrors forward'): the input slices' gradients are summed over ranks that hold different slices (2 ranks: wrong dx)."""

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
        return y + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        flat_grad = grad_y.reshape(-1, grad_y.shape[-1])
        grad_w = flat_grad.T @ x.reshape(-1, x.shape[-1])
        grad_x = grad_y @ weight
        dist.all_reduce(grad_x)
        return grad_x, grad_w, flat_grad.sum(0)


tp_linear = (ColumnParallelLinear, RowParallelLinear)


ANSWER = tp_linear
KIND = "honest"
PROVE = {"world_size": 2, "d_hidden": 8}
