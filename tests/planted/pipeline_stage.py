"""Wrong GPipe stages (send/recv between neighbouring ranks)."""

import torch
import torch.distributed as dist


def _stage(stage, inputs, targets, activation_shape, scale=True, send_received=False, sum_backward=False):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
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
            y = torch.nn.functional.mse_loss(y, targets[i]) / (m if scale else 1)
        else:
            dist.send(y.detach(), dst=rank + 1)
        xs.append(x)
        ys.append(y)
    for i in reversed(range(m)):
        grad = None
        if last:
            ys[i].backward()
        else:
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=rank + 1)
            ys[i].sum().backward() if sum_backward else ys[i].backward(grad)
        if not first:
            dist.send(grad if send_received and grad is not None else xs[i].grad, dst=rank - 1)
    return sum(y.item() for y in ys) if last else None


def loss_not_divided_by_m(stage, inputs, targets, activation_shape):
    return _stage(stage, inputs, targets, activation_shape, scale=False)


def sends_the_received_gradient(stage, inputs, targets, activation_shape):
    """Passes the gradient it received on, instead of the gradient w.r.t. its own input."""
    return _stage(stage, inputs, targets, activation_shape, send_received=True)


def backward_from_a_sum(stage, inputs, targets, activation_shape):
    """Runs y.sum().backward() on stages that are not last, ignoring the received gradient."""
    return _stage(stage, inputs, targets, activation_shape, sum_backward=True)


PLANTED = [loss_not_divided_by_m, sends_the_received_gradient, backward_from_a_sum]
