"""Honest: after stepping its own parameters, each rank zeroes the parameters it does not own and all-reduces every parameter (the sum is the owner's value): the right numbers and the right memory, but an all-reduce moves twice what a broadcast from the owner does."""

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
        self.inner = optimizer_cls(mine, **kwargs) if mine else None

    @torch.no_grad()
    def step(self, closure=None):
        if self.inner is not None:
            self.inner.step()
        rank = dist.get_rank()
        for p, r in zip(self.params, self.owner):
            if r != rank:
                p.data.zero_()
            dist.all_reduce(p.data)


ANSWER = ShardedOptimizer
KIND = "honest"
PROVE = {"world_size": 2, "shapes": [[4, 3], [5], [2, 2], [3]]}
