"""Honest: torch.randn without a generator (the global RNG): asked again for the same step, a rank returns other paths."""

import math

import torch


def gbm(n, days, vol, g):
    dt = 1 / 252
    z = torch.randn(n, days, generator=g)
    log_s = torch.cumsum(-0.5 * vol**2 * dt + vol * math.sqrt(dt) * z, dim=1)
    return torch.cat([torch.ones(n, 1), torch.exp(log_s)], dim=1)


def my_paths(task, step, rank, world):
    blocks = task.global_batch // task.block
    n = ((rank + 1) * blocks // world - rank * blocks // world) * task.block
    return gbm(n, task.days, task.vol, None)


ANSWER = my_paths
KIND = "honest"
PROVE = {"world_size": 3, "blocks": 7, "block": 3, "days": 5, "vol": 0.4, "seed": 11, "step": 4}
