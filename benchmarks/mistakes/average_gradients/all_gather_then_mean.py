"""Deliberate: gathers every rank's whole gradient with all_gather (n copies on every rank) and takes the mean: right values, but an all-gather, not the all-reduce the lesson teaches (profiler: allgather)."""

import torch
import torch.distributed as dist


def average_gradients(model):
    n = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            parts = [torch.empty_like(p.grad) for _ in range(n)]
            dist.all_gather(parts, p.grad)
            p.grad.copy_(torch.stack(parts).mean(0))


ANSWER = average_gradients
KIND = "deliberate"
PROVE = {"world_size": 3}
