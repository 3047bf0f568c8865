# exercise: sharded_optimizer
# kind: fool
# mistake: every rank runs the full optimizer on all parameters (state replicated, no sharding at all): right numbers, none of the memory saving; broadcasts kept so the collectives look right.
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
        self.inner = optimizer_cls(self.params, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


ANSWER = ShardedOptimizer
