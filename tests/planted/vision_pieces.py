"""Wrong pieces for the vision project: SyncBatchNorm's autograd Function and the data shard."""

import torch
import torch.distributed as dist


def _normalise(ctx, x, weight, bias, eps, group, mean, var, n):
    c = x.shape[1]
    shape = [1, c, 1, 1]
    invstd = torch.rsqrt(var + eps).float()
    xhat = (x - mean.float().view(shape)) * invstd.view(shape)
    ctx.save_for_backward(xhat, weight, invstd)
    ctx.n, ctx.group = float(n), group
    return xhat * weight.view(shape) + bias.view(shape), mean.float(), var.float(), torch.tensor(float(n))


class _SyncBN(torch.autograd.Function):
    """Right (the sums in float64), for the wrong ones below to change one thing each."""

    @staticmethod
    def stats(x, group):
        c = x.shape[1]
        xd = x.double()
        s = torch.cat([xd.sum((0, 2, 3)), (xd * xd).sum((0, 2, 3)), torch.tensor([x.numel() / c]).double()])
        dist.all_reduce(s, group=group)
        mean = s[:c] / s[-1]
        return mean, s[c : 2 * c] / s[-1] - mean * mean, s[-1]

    @classmethod
    def forward(cls, ctx, x, weight, bias, eps, group):
        return _normalise(ctx, x, weight, bias, eps, group, *cls.stats(x, group))

    @staticmethod
    def reduce_param_grads(gw, gb, group):
        return gw, gb

    @classmethod
    def backward(cls, ctx, grad_y, *_):
        xhat, weight, invstd = ctx.saved_tensors
        c = weight.numel()
        gb, gw = grad_y.sum((0, 2, 3)), (grad_y * xhat).sum((0, 2, 3))
        sums = cls.input_grad_sums(torch.cat([gb, gw]), ctx.group)
        s = [1, c, 1, 1]
        gx = (weight * invstd).view(s) * (grad_y - (sums[:c] / ctx.n).view(s) - xhat * (sums[c:] / ctx.n).view(s))
        return (gx, *cls.reduce_param_grads(gw, gb, ctx.group), None, None)

    @staticmethod
    def input_grad_sums(sums, group):
        sums = sums.clone()
        dist.all_reduce(sums, group=group)
        return sums


class LocalStatistics(_SyncBN):
    """No all-reduce in the forward: each rank normalises with its own samples' mean and variance."""

    @staticmethod
    def stats(x, group):
        n = x.numel() / x.shape[1]
        return x.double().mean((0, 2, 3)), x.double().var((0, 2, 3), unbiased=False), n

    @staticmethod
    def input_grad_sums(sums, group):
        return sums


class AveragedStatistics(_SyncBN):
    """All-reduces each rank's mean and variance and divides by the world size: wrong with unequal batches, and the
    spread between the ranks' means is lost."""

    @staticmethod
    def stats(x, group):
        c, w = x.shape[1], dist.get_world_size(group)
        s = torch.cat([x.double().mean((0, 2, 3)), x.double().var((0, 2, 3), unbiased=False)])
        dist.all_reduce(s, group=group)
        return s[:c] / w, s[c:] / w, x.numel() / c * w


class Float32Sums(_SyncBN):
    """Σx and Σx² in float32: right near zero, the variance lost for values far from zero."""

    @staticmethod
    def stats(x, group):
        c = x.shape[1]
        s = torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), torch.tensor([x.numel() / c])])
        dist.all_reduce(s, group=group)
        mean = s[:c] / s[-1]
        return mean.double(), (s[c : 2 * c] / s[-1] - mean * mean).double(), s[-1]


class ReducedParameterGradients(_SyncBN):
    """All-reduces the weight and bias gradients too: the data-parallel wrapper reduces them again."""

    @staticmethod
    def reduce_param_grads(gw, gb, group):
        gw, gb = gw.clone(), gb.clone()
        dist.all_reduce(gw, group=group)
        dist.all_reduce(gb, group=group)
        return gw, gb


class LocalBackward(_SyncBN):
    """Forward right, backward as plain BatchNorm's on this rank: the input gradient misses the other ranks' sums."""

    @staticmethod
    def input_grad_sums(sums, group):
        return sums * dist.get_world_size(group)


SYNC_BATCHNORM = {
    "LocalStatistics": LocalStatistics,
    "AveragedStatistics": AveragedStatistics,
    "Float32Sums": Float32Sums,
    "ReducedParameterGradients": ReducedParameterGradients,
    "LocalBackward": LocalBackward,
}


def _check(global_batch, world_size):
    if global_batch % world_size:
        raise ValueError("global_batch does not divide by world_size")


def _read(positions, num_samples, order):
    epochs = positions // num_samples
    out = torch.empty(len(positions), dtype=torch.long)
    for e in epochs.unique().tolist():
        m = epochs == e
        out[m] = order(e)[positions[m] % num_samples]
    return out


def strided(step, rank, world_size, global_batch, num_samples, order):
    """rank::world_size (DistributedSampler's arrangement): the right samples, parts not the global batch's blocks."""
    _check(global_batch, world_size)
    return _read(step * global_batch + torch.arange(rank, global_batch, world_size), num_samples, order)


def one_epoch_per_batch(step, rank, world_size, global_batch, num_samples, order):
    """The epoch of the batch's first sample for all of it: a batch crossing an epoch's end re-reads that epoch."""
    _check(global_batch, world_size)
    b = global_batch // world_size
    start = step * global_batch + rank * b
    return order(step * global_batch // num_samples)[torch.arange(start, start + b) % num_samples]


def own_permutation(step, rank, world_size, global_batch, num_samples, order):
    """torch.randperm with the process's own random state: each rank shuffles differently."""
    _check(global_batch, world_size)
    b = global_batch // world_size
    pos = step * global_batch + rank * b + torch.arange(b)
    return torch.randperm(num_samples)[pos % num_samples]


def floor_division(step, rank, world_size, global_batch, num_samples, order):
    """global_batch // world_size without a check: a batch that does not split silently drops samples."""
    b = global_batch // world_size
    return _read(step * global_batch + rank * b + torch.arange(b), num_samples, order)


DATA_SHARD = {
    "strided": strided,
    "one_epoch_per_batch": one_epoch_per_batch,
    "own_permutation": own_permutation,
    "floor_division": floor_division,
}
