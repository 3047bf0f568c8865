"""Deliberate: keeps a full AdamW's moments for every parameter on every rank, in torch.frombuffer(bytearray(...)) tensors outside any torch.optim state (replicated state, weighed by tracemalloc)."""

import torch


def partition(numels, world_size):
    load, owner = [0] * world_size, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + numels[i]
    return owner


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, lr=1e-3, weight_decay=1e-2, betas=(0.9, 0.999), eps=1e-8, **kwargs):
        super().__init__(params, dict(lr=lr))
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.hyper = (lr, weight_decay, betas, eps)
        self.moments = [
            (
                torch.frombuffer(bytearray(4 * p.numel()), dtype=torch.float32).view_as(p),
                torch.frombuffer(bytearray(4 * p.numel()), dtype=torch.float32).view_as(p),
            )
            for p in self.params
        ]
        self.t = 0

    @torch.no_grad()
    def step(self, closure=None):
        lr, wd, (b1, b2), eps = self.hyper
        self.t += 1
        for p, (m, v) in zip(self.params, self.moments):
            p.mul_(1 - lr * wd)
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / (1 - b2**self.t)).sqrt().add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - b1**self.t))


ANSWER = ShardedOptimizer
KIND = "deliberate"
PROVE = {"world_size": 2, "shapes": [[64, 64], [256], [32, 32]], "weigh_heap": True}
