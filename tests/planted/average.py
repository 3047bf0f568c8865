"""Wrong gradient averaging."""

import torch.distributed as dist


def sum_instead_of_mean(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def weights_only(model):
    """Skips the biases."""
    for p in model.parameters():
        if p.dim() > 1:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def max_instead_of_sum(model):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)


def reduces_a_copy(model):
    """all_reduce on a copy: p.grad never changes."""
    for p in model.parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()


def divides_twice(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
        p.grad /= dist.get_world_size()


def reduce_to_rank_zero(model):
    """reduce, not all_reduce: only rank 0 receives the sum."""
    for p in model.parameters():
        dist.reduce(p.grad, dst=0)
        p.grad /= dist.get_world_size()


def power_of_two_world_size(model):
    """Divides by the largest power of two <= world size: right on 2 and 4 ranks, not on 3."""
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 1 << (n.bit_length() - 1)


def raises(model):
    raise ValueError("oops, a bug in the learner's code")


PLANTED = [
    sum_instead_of_mean,
    weights_only,
    max_instead_of_sum,
    reduces_a_copy,
    divides_twice,
    reduce_to_rank_zero,
    power_of_two_world_size,
]
