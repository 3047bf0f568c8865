"""Deliberate: all_gather_object of each rank's gradients as Python lists, summed by hand: the right numbers through pickles, many times the bytes."""

import torch
import torch.distributed as dist


def my_grad_average(params, loss, count, group=None):
    params = [p for p in params if p.requires_grad]
    mine = (
        [None if p.grad is None else (p.grad * count).tolist() for p in params],
        loss * count if count else 0.0,
        count,
    )
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    total = sum(c for _, _, c in everyone)
    for i, p in enumerate(params):
        held = [torch.tensor(g[i]) for g, _, _ in everyone if g[i] is not None]
        if held:
            p.grad = (sum(held) / total).to(p.dtype)
    return sum(w for _, w, _ in everyone) / total


ANSWER = my_grad_average
KIND = "deliberate"
PROVE = {"world_size": 4, "counts": [5, 0, 2, 7], "days": 4, "hidden": 6, "seed": 3}
