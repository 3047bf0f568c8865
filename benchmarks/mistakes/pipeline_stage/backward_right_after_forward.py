"""Honest: runs each micro-batch's backward right after its forward (one in flight): right gradients, but not GPipe's all-forwards-then-all-backwards order the task asks for (messages interleaved)."""

import torch
import torch.distributed as dist


def pipeline_stage_step(stage, inputs, targets, activation_shape):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    m = len(inputs)
    total = 0.0
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        y = stage(x)
        if last:
            loss = torch.nn.functional.mse_loss(y, targets[i]) / m
            loss.backward()
            total += loss.item()
        else:
            dist.send(y.detach(), dst=rank + 1)
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)
        if not first:
            dist.send(x.grad, dst=rank - 1)
    return total if last else None


ANSWER = pipeline_stage_step
KIND = "honest"
PROVE = {"world_size": 3, "micro": 4}
