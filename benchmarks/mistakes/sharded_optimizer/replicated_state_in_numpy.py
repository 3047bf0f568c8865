"""Deliberate: runs a full torch AdamW on every rank but hides its state from torch.optim's state dict by moving each moment into a NumPy array between steps (every rank holds all the state)."""

import torch


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
        self.inner = optimizer_cls(self.params, **kwargs)
        self.stash = None

    @torch.no_grad()
    def step(self, closure=None):
        if self.stash is not None:
            for p, st in zip(self.params, self.stash):
                self.inner.state[p] = {k: torch.from_numpy(v.copy()) for k, v in st.items()}
        self.inner.step()
        self.stash = [{k: v.numpy().copy() for k, v in self.inner.state[p].items()} for p in self.params]
        self.inner.state.clear()


ANSWER = ShardedOptimizer
KIND = "deliberate"
PROVE = {"world_size": 2, "shapes": [[64, 64], [256], [32, 32]], "weigh_heap": True}
