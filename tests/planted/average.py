"""Wrong gradient averaging."""

import torch.distributed as dist


def _with_grad(model):
    """The parameters that have a gradient (a frozen or unused one has p.grad None): each bug below is only its own."""
    return [p for p in model.parameters() if p.grad is not None]


def sum_instead_of_mean(model):
    for p in _with_grad(model):
        dist.all_reduce(p.grad)


def weights_only(model):
    """Skips the biases."""
    for p in _with_grad(model):
        if p.dim() > 1:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def max_instead_of_sum(model):
    for p in _with_grad(model):
        dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)


def reduces_a_copy(model):
    """all_reduce on a copy: p.grad never changes."""
    for p in _with_grad(model):
        g = p.grad.clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()


def divides_twice(model):
    for p in _with_grad(model):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
        p.grad /= dist.get_world_size()


def reduce_to_rank_zero(model):
    """reduce, not all_reduce: only rank 0 receives the sum."""
    for p in _with_grad(model):
        dist.reduce(p.grad, dst=0)
        p.grad /= dist.get_world_size()


def power_of_two_world_size(model):
    """Divides by the largest power of two <= world size: right on 2 and 4 ranks, not on 3."""
    n = dist.get_world_size()
    for p in _with_grad(model):
        dist.all_reduce(p.grad)
        p.grad /= 1 << (n.bit_length() - 1)


def raises(model):
    raise ValueError("oops, a bug in the learner's code")


def no_none_guard(model):
    """The recipe without `if p.grad is not None`: right while every parameter has a gradient (issue 47: no check
    had a frozen or unused parameter)."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


_TABLE = {}


def _old_fixed_problem_gradients():
    """The global-batch gradients of the problem the old checks always used (seed 0, widths 16, batch 24)."""
    import torch

    from simlib.models import MLP, make_regression

    torch.manual_seed(0)
    model = MLP(16, 2, in_features=8)
    x, y = make_regression(24, 8, seed=1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def tabulates(model):
    """Sends nothing: looks the model up in a table of the fixed problem's gradients and writes them in (issue 47:
    the checks' problems came from fixed seeds, so a table of expected outputs passed)."""
    if not _TABLE:
        _TABLE["grads"] = _old_fixed_problem_gradients()
    params = list(model.parameters())
    if [p.shape for p in params] == [g.shape for g in _TABLE["grads"]]:
        for p, g in zip(params, _TABLE["grads"]):
            p.grad.copy_(g)


PLANTED = [
    sum_instead_of_mean,
    weights_only,
    max_instead_of_sum,
    reduces_a_copy,
    divides_twice,
    reduce_to_rank_zero,
    power_of_two_world_size,
    no_none_guard,
    tabulates,
]


def flat_buffer_in_float32(model):
    """Each gradient all-reduced in a float32 buffer (the default dtype): a float64 model's gradients are rounded."""
    for p in _with_grad(model):
        buffer = p.grad.float()
        dist.all_reduce(buffer)
        p.grad = (buffer / dist.get_world_size()).to(p.grad.dtype)


PLANTED += [flat_buffer_in_float32]
