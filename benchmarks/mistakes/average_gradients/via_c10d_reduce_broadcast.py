"""Deliberate: reduces to rank 0 and broadcasts back through torch.distributed.distributed_c10d (two collectives, rank 0 a bottleneck), not one all-reduce (profiler: reduce and broadcast)."""

from torch.distributed import distributed_c10d as c10d


def average_gradients(model):
    n = c10d.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            c10d.reduce(p.grad, dst=0)
            c10d.broadcast(p.grad, src=0)
            p.grad /= n


ANSWER = average_gradients
KIND = "deliberate"
PROVE = {"world_size": 3}
