"""Honest: all-reduces only the gradients this rank has: the rank without paths calls fewer collectives than its peers, so the ranks pair the wrong tensors (an abort or a hang)."""

import torch
import torch.distributed as dist


def my_grad_average(params, loss, count, group=None):
    total = torch.tensor([float(count)])
    dist.all_reduce(total, group=group)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(count)
            dist.all_reduce(p.grad, group=group)
            p.grad /= total
    t = torch.tensor([loss * count if count else 0.0])
    dist.all_reduce(t, group=group)
    return float(t / total)


ANSWER = my_grad_average
KIND = "honest"
PROVE = {"world_size": 3, "counts": [5, 0, 2], "days": 4, "hidden": 6, "seed": 3}
