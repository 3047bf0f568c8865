"""The finance project's two learner pieces and the course's own (the fallback a stuck learner switches on).

``paths``: this rank's Monte-Carlo paths for a step. The global batch is ``global_batch // block`` blocks; block
``b`` of step ``s`` is drawn from its own stream, ``generator(seed, 5, s, b)`` (:mod:`simlib.projects.seeding`),
so the paths belong to the *block*, never to the rank: no two ranks, and no two steps, draw the same numbers, and
the global batch is the same at every world size (one process equals many). Each rank simulates only its own
share of the blocks, contiguous and balanced (within one block of each other when the blocks do not divide).

``grad_average``: after the backward, the count-weighted average of the gradients over the ranks: each rank's
gradient is the mean over *its* paths, so the global-batch gradient is ``sum_r n_r g_r / sum_r n_r``; a plain mean
of the ranks' means is right only when every rank holds as many paths. The same weights give the loss logged for
the step. One all-reduce carries the weighted gradients, the weighted loss and the count together.

:class:`CountWeightedDataParallel` is the data-parallel wrapper the finance task installs when a learner's
``grad_average`` is in the run (``HedgingTask.data_parallel``): it counts the paths each rank ran forward and calls
the piece where the plan's wrapper would all-reduce.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..seeding import generator

__all__ = ["rank_blocks", "rank_paths", "average_by_count", "CountWeightedDataParallel"]

TRADING_DAYS = 252
PATHS_STREAM = 5  # the second key of every training path block's stream: (seed, 5, step, block)


def rank_blocks(blocks: int, rank: int, world: int) -> range:
    """The blocks rank ``rank`` of ``world`` simulates: a contiguous, balanced share (sizes differ by at most one)."""
    return range(rank * blocks // world, (rank + 1) * blocks // world)


def rank_paths(task, step: int, rank: int, world: int) -> torch.Tensor:
    """The course's ``paths`` piece: rank ``rank``'s paths of step ``step`` as (n_rank, task.days + 1), S_0 = 1."""
    mine = rank_blocks(task.global_batch // task.block, rank, world)
    if not len(mine):
        return torch.empty(0, task.days + 1)
    return torch.cat([gbm_block(task.block, task.days, task.vol, (task.seed, PATHS_STREAM, step, b)) for b in mine])


def gbm_paths(z: torch.Tensor, vol: float) -> torch.Tensor:
    """Zero-drift GBM paths from standard normals ``z`` (paths, days): S_0 = 1, daily log returns
    -vol^2 dt / 2 + vol sqrt(dt) z (the Ito term keeps E[S_t] = 1: a martingale), dt = 1/252 of a year."""
    dt = 1 / TRADING_DAYS
    steps = -0.5 * vol**2 * dt + vol * math.sqrt(dt) * z
    return torch.cat([torch.ones(z.shape[0], 1, dtype=z.dtype, device=z.device), torch.exp(torch.cumsum(steps, 1))], 1)


def gbm_block(n: int, days: int, vol: float, keys) -> torch.Tensor:
    """``n`` GBM paths of ``days`` daily steps drawn from the stream of ``keys`` (on the CPU)."""
    return gbm_paths(torch.randn(n, days, generator=generator(*keys)), vol)


def average_by_count(params, loss: float, count: int, group=None) -> float:
    """The course's ``grad_average`` piece: every ``p.grad`` of ``params`` becomes the count-weighted average over
    the ranks of ``group``, and the return value is the global mean loss (this rank's ``loss`` is the mean over its
    ``count`` paths; nan when ``count`` is 0). A parameter without a gradient on some rank counts as a zero there;
    one without a gradient on every rank keeps ``p.grad = None``; frozen ones (requires_grad False) are left out.
    One all-reduce: the weighted gradients, the weighted loss, the count and a has-gradient flag per tensor."""
    params = [p for p in params if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
    sizes = [p.numel() for p in params]
    flat = torch.zeros(sum(sizes) + 2 + len(params), dtype=dtype, device=device)
    offset = 0
    for i, p in enumerate(params):
        if p.grad is not None and count:
            flat[offset : offset + sizes[i]] = p.grad.reshape(-1) * count
        flat[sum(sizes) + 2 + i] = float(p.grad is not None)
        offset += sizes[i]
    flat[sum(sizes)] = loss * count if count else 0.0  # a rank without paths has a nan mean loss: weight 0
    flat[sum(sizes) + 1] = count
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(flat, group=group)
    total = float(flat[sum(sizes) + 1])
    if total <= 0:
        raise ValueError("no rank holds any path this step (every count is 0): there is nothing to average")
    offset = 0
    for i, p in enumerate(params):
        if float(flat[sum(sizes) + 2 + i]) > 0:  # some rank has a gradient for it
            mean = (flat[offset : offset + sizes[i]] / total).view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = mean
            else:
                p.grad.copy_(mean)
        offset += sizes[i]
    return float(flat[sum(sizes)]) / total


class CountWeightedDataParallel(nn.Module):
    """Data parallelism whose gradient step is ``average(params, loss, count, group)`` (the ``grad_average`` piece):
    each forward adds its rows to this rank's count (and their squared hedging errors to the loss it reports);
    :meth:`finish_gradient_synchronization` (called after the backward, as for simlib's wrappers) averages by count.
    ``no_sync()`` accumulates as with DDP; ``last_loss`` is the step's global loss by the same weights."""

    def __init__(self, module: nn.Module, average, task=None, group=None, timeline=None):
        super().__init__()
        from ...parallel.data import broadcast_parameters

        self.module, self.average, self.task, self.group, self.timeline = module, average, task, group, timeline
        self.process_group = group
        self.require_backward_grad_sync = True
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.count, self.squared, self.last_loss = 0, 0.0, None
        broadcast_parameters(module, group=group)

    def forward(self, x, *args, **kwargs):
        out = self.module(x, *args, **kwargs)
        self.count += int(x.shape[0])
        if self.task is not None:
            with torch.no_grad():
                self.squared += float(((out.detach().float() - self.task.payoff(x).float()) ** 2).sum())
        return out

    @contextmanager
    def no_sync(self):
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        count, loss = self.count, (self.squared / self.count if self.count else float("nan"))
        span = self.timeline.span("comm", name="grad_average") if self.timeline is not None else None
        if span is not None:
            with span:
                self.last_loss = self.average(self.params, loss, count, self.group)
        else:
            self.last_loss = self.average(self.params, loss, count, self.group)
        self.count, self.squared = 0, 0.0
