"""Honest: last = rank == 1 (written for the two-rank demo): on 3 ranks rank 1 computes a loss and rank 2 never gets an activation (a hang or an error)."""

import torch
import torch.distributed as dist


def pipeline_stage_step(stage, inputs, targets, activation_shape):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == 1
    m = len(inputs)
    xs, ys = [], []
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        y = stage(x)
        if last:
            y = torch.nn.functional.mse_loss(y, targets[i]) / m
        else:
            dist.send(y.detach(), dst=rank + 1)
        xs.append(x)
        ys.append(y)
    for i in reversed(range(m)):
        if last:
            ys[i].backward()
        else:
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=rank + 1)
            ys[i].backward(grad)
        if not first:
            dist.send(xs[i].grad, dst=rank - 1)
    return sum(y.item() for y in ys) if last else None


ANSWER = pipeline_stage_step
KIND = "honest"
PROVE = {"world_size": 3, "micro": 2, "timeout": 40}
