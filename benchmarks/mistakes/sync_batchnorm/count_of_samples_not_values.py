"""Honest: counts samples (N) instead of values per channel (N·H·W): the mean and variance are H·W times too large on images."""

import torch
import torch.distributed as dist


class MySyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, c] + [1] * (x.dim() - 2)
        xd = x.double()
        count = torch.tensor([x.shape[0]], dtype=torch.float64)
        stats = torch.cat([xd.sum(dims), (xd * xd).sum(dims), count])
        dist.all_reduce(stats, group=group)
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c : 2 * c] / n - mean * mean
        invstd = torch.rsqrt(var + eps).float()
        xhat = (x - mean.float().view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.n, ctx.group, ctx.dims, ctx.shape = n.item(), group, dims, shape
        return xhat * weight.view(shape) + bias.view(shape), mean.float(), var.float(), n.float()

    @staticmethod
    def backward(ctx, grad_y, _grad_mean, _grad_var, _grad_count):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape, c = ctx.dims, ctx.shape, weight.numel()
        grad_bias = grad_y.sum(dims)
        grad_weight = (grad_y * xhat).sum(dims)
        sums = torch.cat([grad_bias, grad_weight])
        dist.all_reduce(sums, group=ctx.group)
        mean_dy, mean_dy_xhat = sums[:c] / ctx.n, sums[c:] / ctx.n
        grad_x = (weight * invstd).view(shape) * (grad_y - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape))
        return grad_x, grad_weight, grad_bias, None, None


ANSWER = MySyncBatchNorm
KIND = "honest"
PROVE = {"world_size": 2, "sizes": [3, 5], "channels": 3, "hw": [2, 2], "center": 0.0, "spread": 1.0}
