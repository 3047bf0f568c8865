# exercise: average_gradients
# kind: honest
# mistake: all-reduces (sum) but forgets to divide by the world size: gradients n times too large.
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


ANSWER = average_gradients
