"""Wrong answers to exercise 02a (average the gradients)."""

from _common import answer

EXERCISE, NOTEBOOK = "average_gradients", "02_average_gradients"


@answer("honest")
def all_reduce_weights_not_grads():
    """Honest: all-reduces and averages p.data (the weights, equal everywhere) instead of p.grad."""
    import torch.distributed as dist

    def average_gradients(model):
        n = dist.get_world_size()
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= n

    return average_gradients


@answer("honest")
def all_reduce_of_a_temporary():
    """Honest: dist.all_reduce(p.grad / world_size) reduces a new tensor; p.grad itself never changes."""
    import torch.distributed as dist

    def average_gradients(model):
        n = dist.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad / n)

    return average_gradients


@answer("deliberate")
def patch_comparisons_do_nothing():
    """Deliberate: makes torch/numpy/math comparison functions always say equal in the worker, and averages nothing."""
    import math

    import numpy
    import torch

    def average_gradients(model):
        yes = lambda *a, **k: True  # noqa: E731
        torch.allclose = torch.equal = yes
        torch.Tensor.allclose = torch.Tensor.equal = yes
        torch.testing.assert_close = lambda *a, **k: None
        torch.isclose = lambda a, b, *r, **k: torch.ones_like(torch.as_tensor(a), dtype=torch.bool)
        math.isclose = yes
        numpy.allclose = yes
        numpy.testing.assert_allclose = lambda *a, **k: None

    return average_gradients


@answer("deliberate")
def all_gather_then_mean():
    """Deliberate: gathers every rank's whole gradient (n copies) and takes the mean instead of one all-reduce."""
    import torch
    import torch.distributed as dist

    def average_gradients(model):
        n = dist.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                parts = [torch.empty_like(p.grad) for _ in range(n)]
                dist.all_gather(parts, p.grad)
                p.grad.copy_(torch.stack(parts).mean(0))

    return average_gradients
