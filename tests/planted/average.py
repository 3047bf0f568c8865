"""Wrong gradient averaging."""
import torch.distributed as dist


def sum_instead_of_mean(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def weights_only(model):
    """Skips the biases."""
    for p in model.parameters():
        if p.dim() > 1:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def max_instead_of_sum(model):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)


def reduces_a_copy(model):
    """all_reduce on a copy: p.grad never changes."""
    for p in model.parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()


def raises(model):
    raise ValueError("oops, a bug in the learner's code")


PLANTED = [sum_instead_of_mean, weights_only, max_instead_of_sum, reduces_a_copy]
