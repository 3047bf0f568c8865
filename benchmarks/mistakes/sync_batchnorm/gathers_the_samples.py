"""Deliberate: all-gathers every rank's activations and runs plain BatchNorm on the global batch: the right numbers, but it moves the samples, not a few statistics per channel."""

import torch
import torch.distributed as dist


class MySyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, c] + [1] * (x.dim() - 2)
        world = dist.get_world_size(group)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([x.shape[0]]), group=group)
        most = int(max(sizes))
        padded = torch.zeros((most, *x.shape[1:]), dtype=x.dtype)
        padded[: x.shape[0]] = x
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=group)
        xd = torch.cat([p[: int(s)] for p, s in zip(parts, sizes)]).double()
        n = torch.tensor(float(xd.numel() // c), dtype=torch.float64)
        mean = xd.mean(dims)
        var = xd.var(dims, unbiased=False)
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
KIND = "deliberate"
PROVE = {"world_size": 2, "sizes": [3, 5], "channels": 3, "hw": [2, 2], "center": 0.0, "spread": 1.0}
