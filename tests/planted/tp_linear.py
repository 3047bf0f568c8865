"""Wrong column-/row-parallel Linear autograd functions."""

import torch
import torch.distributed as dist


def _grads(grad_y, x, weight):
    flat = grad_y.reshape(-1, grad_y.shape[-1])
    return flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)


class _Column(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_x = grad_y @ weight
        dist.all_reduce(grad_x)
        return (grad_x, *_grads(grad_y, x, weight))


class _Row(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = x @ weight.T
        dist.all_reduce(y)
        return y + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        return (grad_y @ weight, *_grads(grad_y, x, weight))


class _ColumnNoAllReduce(_Column):
    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        return (grad_y @ weight, *_grads(grad_y, x, weight))


class _RowNoAllReduce(_Row):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias


class _RowBiasBeforeAllReduce(_Row):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = x @ weight.T + bias
        dist.all_reduce(y)
        return y


class _ColumnAllReducesWeightGrad(_Column):
    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_x = grad_y @ weight
        dist.all_reduce(grad_x)
        grad_w, grad_b = _grads(grad_y, x, weight)
        dist.all_reduce(grad_w)
        return grad_x, grad_w, grad_b


column_backward_without_all_reduce = (_ColumnNoAllReduce, _Row)
row_forward_without_all_reduce = (_Column, _RowNoAllReduce)
row_bias_before_all_reduce = (_Column, _RowBiasBeforeAllReduce)
weight_gradient_all_reduced = (_ColumnAllReducesWeightGrad, _Row)

PLANTED = {
    "column_backward_without_all_reduce": column_backward_without_all_reduce,
    "row_forward_without_all_reduce": row_forward_without_all_reduce,
    "row_bias_before_all_reduce": row_bias_before_all_reduce,
    "weight_gradient_all_reduced": weight_gradient_all_reduced,
}
