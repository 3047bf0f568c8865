# exercise: sharded_optimizer
# kind: fool
# mistake: ignores optimizer_cls and runs its own momentum SGD with the momentum buffers for ALL parameters kept in NumPy (invisible to torch's memory accounting, not sharded), and ignores every other hyper-parameter.
import numpy as np
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
        self.lr = kwargs.get("lr", 1e-3)
        self.momentum = kwargs.get("momentum", 0.0)
        self.buf = [np.zeros(p.shape, dtype=np.float32) for p in self.params]

    @torch.no_grad()
    def step(self, closure=None):
        for p, b in zip(self.params, self.buf):
            if p.grad is None:
                continue
            b *= self.momentum
            b += p.grad.numpy()
            p -= self.lr * torch.from_numpy(b)
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


ANSWER = ShardedOptimizer
