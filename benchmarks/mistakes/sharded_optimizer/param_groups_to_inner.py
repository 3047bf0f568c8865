"""Honest: passes self.param_groups to the inner optimizer ('keep the groups'): they hold every parameter, so every rank holds the whole state (2 ranks: twice the state per rank)."""

import torch
import torch.distributed as dist


def partition(numels, world_size):
    load, owner = [0] * world_size, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + numels[i]
    return owner


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.owner = partition([p.numel() for p in self.params], dist.get_world_size())
        rank = dist.get_rank()
        mine = [p for p, r in zip(self.params, self.owner) if r == rank]
        self.inner = optimizer_cls(self.param_groups, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        if self.inner is not None:
            self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


ANSWER = ShardedOptimizer
KIND = "honest"
PROVE = {"world_size": 2, "shapes": [[4, 3], [5], [2, 2], [3]]}
