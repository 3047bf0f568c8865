"""Honest: returns exp(cumsum) without the column of ones: (paths, days), S_0 missing."""

import math

import torch

from simlib.projects.seeding import generator


def my_paths(task, step, rank, world):
    blocks = task.global_batch // task.block
    dt = 1 / 252
    out = [torch.empty(0, task.days)]
    for b in range(rank * blocks // world, (rank + 1) * blocks // world):
        z = torch.randn(task.block, task.days, generator=generator(task.seed, 5, step, b))
        out.append(torch.exp(torch.cumsum(-0.5 * task.vol**2 * dt + task.vol * math.sqrt(dt) * z, dim=1)))
    return torch.cat(out)


ANSWER = my_paths
KIND = "honest"
PROVE = {"world_size": 3, "blocks": 7, "block": 3, "days": 5, "vol": 0.4, "seed": 11, "step": 4}
