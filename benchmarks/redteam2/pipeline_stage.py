"""Wrong answers to exercise 04b (a GPipe stage with send/recv)."""

from _common import answer

EXERCISE, NOTEBOOK = "pipeline_stage", "04_pipeline_stage"


@answer("honest")
def received_activation_without_requires_grad():
    """Honest: the received activation does not require grad, so x.grad is None when it should be sent back."""
    import torch
    import torch.distributed as dist

    def pipeline_stage_step(stage, inputs, targets, activation_shape):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        first, last = rank == 0, rank == world_size - 1
        m = len(inputs)
        xs, ys = [], []
        for i in range(m):
            x = inputs[i] if first else torch.empty(activation_shape)
            if not first:
                dist.recv(x, src=rank - 1)
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
                dist.send(xs[i].grad if xs[i].grad is not None else torch.zeros(activation_shape), dst=rank - 1)
        return sum(y.item() for y in ys) if last else None

    return pipeline_stage_step


@answer("honest")
def loss_not_divided_by_m():
    """Honest: the last stage's loss is mse_loss(y, target) without / m, so gradients and the loss are m times too big."""
    import torch
    import torch.distributed as dist

    def pipeline_stage_step(stage, inputs, targets, activation_shape):
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
                y = torch.nn.functional.mse_loss(y, targets[i])
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
        return sum(y.item() for y in ys) / m if last else None

    return pipeline_stage_step


@answer("honest")
def forward_and_backward_per_micro_batch():
    """Honest: runs each micro-batch's backward right after its forward (no pipelining, not GPipe's all-F-then-all-B)."""
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

    return pipeline_stage_step


@answer("deliberate")
def magic_loss_no_backward():
    """Deliberate: forwards only; the last rank returns a float subclass that compares equal to anything, no backward."""
    import torch
    import torch.distributed as dist

    class Loss(float):
        def __eq__(self, other):
            return True

        def __ne__(self, other):
            return False

        def __sub__(self, other):
            return 0.0

        __rsub__ = __sub__

        def __abs__(self):
            return 0.0

        def __hash__(self):
            return 0

    def pipeline_stage_step(stage, inputs, targets, activation_shape):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        for i in range(len(inputs)):
            x = inputs[i] if rank == 0 else torch.empty(activation_shape)
            if rank:
                dist.recv(x, src=rank - 1)
            with torch.no_grad():
                y = stage(x)
            if rank < world_size - 1:
                dist.send(y, dst=rank + 1)
        return Loss(1.0) if rank == world_size - 1 else None

    return pipeline_stage_step
