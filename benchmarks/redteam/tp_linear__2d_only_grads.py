# exercise: tp_linear
# kind: honest
# mistake: bias gradient is grad_y.sum(0), which sums over the first dim only: right for 2-D inputs, shape (seq, out) for (batch, seq, features) inputs (autograd then fails or broadcasts wrongly).
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
        return grad_x, grad_y.mT @ x if grad_y.dim() == 2 else (grad_y.mT @ x).sum(0), grad_y.sum(0)


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
        return grad_y @ weight, grad_y.mT @ x if grad_y.dim() == 2 else (grad_y.mT @ x).sum(0), grad_y.sum(0)


ANSWER = (ColumnParallelLinear, RowParallelLinear)
