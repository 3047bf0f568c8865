"""BatchNorm under data parallelism: per-rank statistics, or statistics over the whole global batch.

A ``BatchNorm2d`` normalises with the mean and variance of the batch *it sees*. Under data parallelism each
rank sees only its shard, so with plain BatchNorm the ranks normalise with different, noisier statistics
than one process would on the global batch (and keep different running averages). ``SyncBatchNorm``
(Ioffe & Szegedy 2015; Peng et al. 2018, "MegDet", introduced cross-GPU BatchNorm) computes them over the
whole group instead:

    forward:   all_reduce [Σx, Σx², n] per channel  -> global mean and variance
    backward:  all_reduce [Σ∂y', Σ∂y'·x̂] per channel -> the gradient through the shared statistics

The forward's sums are taken in float64: the variance Σx²/n − mean² subtracts two numbers close to each other
when the values sit far from zero compared with their spread (mean 1000, std 1: Σx²/n ≈ 10⁶, and float32 keeps
only about 7 digits of it), so in float32 it loses most of its digits; float64 keeps them (one all-reduce of
2C + 1 float64 per layer, still tiny). Ranks may hold different numbers of samples: the counts are summed too.

Two small all-reduces per BatchNorm layer per step, on the critical path (they cannot overlap). With
that, a 2- or 4-rank run equals the one-process run on the global batch. ``torch.nn.SyncBatchNorm`` does
the same but only on GPUs; :func:`convert_sync_batchnorm` uses torch's on CUDA and this one elsewhere.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["SyncBatchNorm", "SyncBatchNormFunction", "convert_sync_batchnorm"]


class SyncBatchNormFunction(torch.autograd.Function):
    """BatchNorm's training step over the group: ``apply(x, weight, bias, eps, group) -> (y, mean, var, count)``
    (``var`` biased, ``count`` the values per channel over every rank). The slot ``sync_batchnorm`` of the vision
    project (:mod:`simlib.pieces`): a learner's Function with the same ``apply`` takes its place."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        xd = x.double()
        stats = torch.cat(
            [xd.sum(dims), (xd * xd).sum(dims), torch.tensor([x.numel() / c], dtype=torch.float64, device=x.device)]
        )
        dist.all_reduce(stats, group=group)  # Σx, Σx², n over every rank's shard
        n = stats[-1]
        mean64 = stats[:c] / n
        var64 = (stats[c : 2 * c] / n - mean64 * mean64).clamp_min(0)  # biased, as BatchNorm normalises with
        mean, var = mean64.float(), var64.float()
        shape = [1, c] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var64 + eps).float()
        xhat = (x.float() - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.group, ctx.n, ctx.dims, ctx.shape = group, n, dims, shape
        return (xhat * weight.view(shape) + bias.view(shape)).to(x.dtype), mean, var, n.float()

    @staticmethod
    def backward(ctx, grad_out, _gm, _gv, _gn):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape, c = ctx.dims, ctx.shape, weight.numel()
        g = grad_out.float()
        grad_bias = g.sum(dims)
        grad_weight = (g * xhat).sum(dims)  # local: the DP wrapper averages these
        both = torch.cat([grad_bias, grad_weight])
        dist.all_reduce(both, group=ctx.group)  # Σ∂y and Σ∂y·x̂ over the global batch
        mean_dy, mean_dy_xhat = both[:c] / ctx.n, both[c:] / ctx.n
        grad_x = (weight * invstd).view(shape) * (g - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape))
        return grad_x.to(grad_out.dtype), grad_weight, grad_bias, None, None


class SyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm whose training statistics cover every rank of ``group`` (eval: the running averages)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, group=None):
        super().__init__(num_features, eps, momentum)
        self.group = group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got shape {tuple(x.shape)}")

    def forward(self, x):
        world = dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1
        if not self.training or world == 1:
            return super().forward(x)
        from .. import pieces

        fn = pieces.get("sync_batchnorm") or SyncBatchNormFunction  # a learner's piece, when the run has one
        out = fn.apply(x, self.weight, self.bias, self.eps, self.group)
        if not (isinstance(out, (tuple, list)) and len(out) == 4 and isinstance(out[0], torch.Tensor)):
            raise ValueError(
                f"{getattr(fn, '__name__', fn)}.apply(x, weight, bias, eps, group) must return (y, mean, var, count): "
                f"y normalised like x, the global mean and biased variance per channel and the global count; "
                f"got {type(out).__name__}"
            )
        y, mean, var, n = out
        mean, var = (torch.as_tensor(t).detach().to(self.running_mean) for t in (mean, var))
        n = torch.as_tensor(n).detach().to(self.running_mean)
        if mean.shape != (x.shape[1],) or var.shape != (x.shape[1],) or n.numel() != 1:
            raise ValueError(
                f"{getattr(fn, '__name__', fn)}: mean and var must hold one value per channel ({x.shape[1]}) and "
                f"count one number; got mean {tuple(mean.shape)}, var {tuple(var.shape)}, count {tuple(n.shape)}"
            )
        n = n.reshape(())
        with torch.no_grad():  # running averages as BatchNorm keeps them (unbiased variance)
            self.num_batches_tracked += 1
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * n / (n - 1).clamp_min(1))
        return y


def convert_sync_batchnorm(module: nn.Module, group=None) -> nn.Module:
    """Replace every ``BatchNorm*d`` of ``module`` by a synchronised one over ``group`` (weights and stats kept).

    On CUDA this is ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``; on CPU (where torch's refuses to run),
    and wherever a run has a learner's ``sync_batchnorm`` piece, it is :class:`SyncBatchNorm` above.
    """
    from .. import pieces

    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    if device.type == "cuda" and pieces.get("sync_batchnorm") is None:  # a learner's piece runs in ours
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group=group)
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        if not (module.affine and module.track_running_stats):
            raise ValueError("convert_sync_batchnorm supports BatchNorm with affine=True and running stats")
        new = SyncBatchNorm(module.num_features, module.eps, module.momentum, group).to(device)
        with torch.no_grad():
            new.weight.copy_(module.weight)
            new.bias.copy_(module.bias)
            new.running_mean.copy_(module.running_mean)
            new.running_var.copy_(module.running_var)
            new.num_batches_tracked.copy_(module.num_batches_tracked)
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, group))
    return module
