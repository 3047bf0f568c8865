# exercise: pipeline_stage
# kind: honest
# mistake: hard-codes 2 stages: rank 0 does forward+send and then receives the gradient, rank 1 never checks whether it has a next stage, so middle stages (3-4 ranks) compute a loss on activations and never forward them.
import torch
import torch.distributed as dist


def pipeline_stage_step(stage, inputs, targets, activation_shape):
    rank = dist.get_rank()
    m = len(inputs)
    xs, ys = [], []
    for i in range(m):
        if rank == 0:
            x = inputs[i]
        else:
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank == 0:
            dist.send(y.detach(), dst=1)
        else:
            y = torch.nn.functional.mse_loss(y, targets[i]) / m
        xs.append(x)
        ys.append(y)
    for i in reversed(range(m)):
        if rank == 0:
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=1)
            ys[i].backward(grad)
        else:
            ys[i].backward()
            dist.send(xs[i].grad, dst=rank - 1)
    return sum(y.item() for y in ys) if rank != 0 else None


ANSWER = pipeline_stage_step
