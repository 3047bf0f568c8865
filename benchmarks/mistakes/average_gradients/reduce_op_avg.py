"""Honest: dist.all_reduce(p.grad, op=dist.ReduceOp.AVG): AVG exists only for NCCL; Gloo (the CPU backend) rejects it (2 ranks on CPU: an error)."""

import torch.distributed as dist


def average_gradients(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


ANSWER = average_gradients
KIND = "honest"
PROVE = {"world_size": 2}
