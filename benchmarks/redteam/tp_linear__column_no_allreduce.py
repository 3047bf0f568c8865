# exercise: tp_linear
# kind: honest
# mistake: column-parallel backward returns the local grad_x without all-reducing it (Megatron's f forgotten): the input gradient misses the other ranks' output slices.
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
        return grad_y @ weight, grad_w, flat_grad.sum(0)


ANSWER = (ColumnParallelLinear, RowParallelLinear)
