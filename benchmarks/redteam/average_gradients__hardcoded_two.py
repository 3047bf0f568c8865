# exercise: average_gradients
# kind: honest
# mistake: world size hard-coded to 2 (the notebook's cluster): right on 2 ranks, wrong on 3 or 4.
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= 2


ANSWER = average_gradients
