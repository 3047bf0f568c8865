"""Honest: block streams seeded (seed, block) without the step: every step trains on the same paths."""

import math

import torch

from simlib.projects.seeding import generator


def gbm(n, days, vol, g):
    dt = 1 / 252
    z = torch.randn(n, days, generator=g)
    log_s = torch.cumsum(-0.5 * vol**2 * dt + vol * math.sqrt(dt) * z, dim=1)
    return torch.cat([torch.ones(n, 1), torch.exp(log_s)], dim=1)


def my_paths(task, step, rank, world):
    blocks = task.global_batch // task.block
    out = [torch.empty(0, task.days + 1)]
    for b in range(rank * blocks // world, (rank + 1) * blocks // world):
        out.append(gbm(task.block, task.days, task.vol, generator(task.seed, 5, b)))
    return torch.cat(out)


ANSWER = my_paths
KIND = "honest"
PROVE = {"world_size": 3, "blocks": 7, "block": 3, "days": 5, "vol": 0.4, "seed": 11, "step": 4}
