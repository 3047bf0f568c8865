"""Deliberate: every rank simulates the whole global batch and keeps its rows: right paths, world-size times the work."""

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
    everything = torch.cat(
        [gbm(task.block, task.days, task.vol, generator(task.seed, 5, step, b)) for b in range(blocks)]
    )
    lo, hi = rank * blocks // world * task.block, (rank + 1) * blocks // world * task.block
    return everything[lo:hi]


ANSWER = my_paths
KIND = "deliberate"
PROVE = {"world_size": 3, "blocks": 7, "block": 3, "days": 5, "vol": 0.4, "seed": 11, "step": 4}
