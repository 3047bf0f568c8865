"""Honest: p.grad.mul_(count) on every parameter: the frozen one, the unused one and everything on the rank without paths have p.grad None (AttributeError)."""

import torch
import torch.distributed as dist


def my_grad_average(params, loss, count, group=None):
    total = torch.tensor([float(count)])
    dist.all_reduce(total, group=group)
    for p in params:
        p.grad.mul_(count)
        dist.all_reduce(p.grad, group=group)
        p.grad /= total
    t = torch.tensor([loss * count if count else 0.0])
    dist.all_reduce(t, group=group)
    return float(t / total)


ANSWER = my_grad_average
KIND = "honest"
PROVE = {"world_size": 3, "counts": [5, 0, 2], "days": 4, "hidden": 6, "seed": 3}
