"""Wrong answers to exercise 05 (column- and row-parallel Linear)."""

from _common import answer

EXERCISE, NOTEBOOK = "tp_linear", "05_tp_linear"


def _column(all_reduce_grad_x=True):
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
            if all_reduce_grad_x:
                dist.all_reduce(grad_x)
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            return grad_x, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)

    return ColumnParallelLinear


def _row(bias_before_reduce=False):
    import torch
    import torch.distributed as dist

    class RowParallelLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            y = x @ weight.T
            if bias_before_reduce:
                y = y + bias
            dist.all_reduce(y)
            return y if bias_before_reduce else y + bias

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            return grad_y @ weight, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)

    return RowParallelLinear


@answer("honest")
def row_bias_added_before_all_reduce():
    """Honest: the row-parallel layer adds its bias to the partial product before the all-reduce (bias counted n times)."""
    return (_column(), _row(bias_before_reduce=True))


@answer("honest")
def column_grad_x_not_all_reduced():
    """Honest: the column-parallel backward returns this rank's partial dL/dx without the all-reduce."""
    return (_column(all_reduce_grad_x=False), _row())


@answer("deliberate")
def all_gather_and_sum_instead_of_all_reduce():
    """Deliberate: every all-reduce replaced by an all_gather of the partials and a local sum (n x the memory)."""
    import torch
    import torch.distributed as dist

    def gathered_sum(t):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        return torch.stack(parts).sum(0)

    class ColumnParallelLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return x @ weight.T + bias

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            return gathered_sum(grad_y @ weight), flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)

    class RowParallelLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return gathered_sum(x @ weight.T) + bias

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            return grad_y @ weight, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)

    return (ColumnParallelLinear, RowParallelLinear)


@answer("honest")
def column_forward_in_bfloat16():
    """Honest: the column-parallel forward multiplies in bfloat16 to save memory and casts back (wrong dtype, ~1e-2 error)."""
    import torch
    import torch.distributed as dist

    class ColumnParallelLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return (x.bfloat16() @ weight.bfloat16().T).float() + bias

        @staticmethod
        def backward(ctx, grad_y):
            x, weight = ctx.saved_tensors
            grad_x = grad_y @ weight
            dist.all_reduce(grad_x)
            flat = grad_y.reshape(-1, grad_y.shape[-1])
            return grad_x, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)

    return (ColumnParallelLinear, _row())
