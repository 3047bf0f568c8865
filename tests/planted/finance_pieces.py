"""Wrong finance pieces (``simlib/projects/finance/pieces.py``): per-rank Monte-Carlo paths and the count-weighted
gradient average. Each is a mistake people make; each must be caught by ``finance_paths`` / ``finance_grad_average``."""

import math

import torch
import torch.distributed as dist

from simlib.projects.seeding import generator

_DT = 1 / 252


def _gbm(n, days, vol, g, ito=True):
    z = torch.randn(n, days, generator=g)
    steps = (-0.5 * vol**2 * _DT if ito else 0.0) + vol * math.sqrt(_DT) * z
    return torch.cat([torch.ones(n, 1), torch.exp(torch.cumsum(steps, 1))], 1)


def _blocks(task, step, lo, hi, keys=lambda task, step, b: (task.seed, 5, step, b), **kw):
    out = [torch.empty(0, task.days + 1)]
    out += [_gbm(task.block, task.days, task.vol, generator(*keys(task, step, b)), **kw) for b in range(lo, hi)]
    return torch.cat(out)


def floor_share_drops_the_rest(task, step, rank, world):
    """per = blocks // world for every rank: the leftover blocks are never simulated."""
    per = (task.global_batch // task.block) // world
    return _blocks(task, step, rank * per, (rank + 1) * per)


def seed_plus_rank(task, step, rank, world):
    """One stream per rank, seeded seed + rank + step: rank 1 at step s draws what rank 0 draws at step s + 1."""
    blocks = task.global_batch // task.block
    n = (rank + 1) * blocks // world - rank * blocks // world
    g = torch.Generator().manual_seed(task.seed + rank + step)
    return _gbm(n * task.block, task.days, task.vol, g)


def same_seed_on_every_rank(task, step, rank, world):
    """Every rank seeds (seed, step): each rank draws the same paths (the classic bug)."""
    blocks = task.global_batch // task.block
    n = (rank + 1) * blocks // world - rank * blocks // world
    return _gbm(n * task.block, task.days, task.vol, generator(task.seed, 5, step))


def no_ito_term(task, step, rank, world):
    """Log returns vol sqrt(dt) z without -vol^2 dt / 2: E[S_T] > 1, the paths drift up."""
    blocks = task.global_batch // task.block
    return _blocks(task, step, rank * blocks // world, (rank + 1) * blocks // world, ito=False)


def global_torch_seed(task, step, rank, world):
    """torch.randn without a generator: the global RNG, so another call gives other paths."""
    blocks = task.global_batch // task.block
    n = (rank + 1) * blocks // world - rank * blocks // world
    return _gbm(n * task.block, task.days, task.vol, None)


def seeded_by_rank_and_step(task, step, rank, world):
    """Streams (seed, step, rank): independent, but the global batch changes with the world size."""
    blocks = task.global_batch // task.block
    n = (rank + 1) * blocks // world - rank * blocks // world
    return _gbm(n * task.block, task.days, task.vol, generator(task.seed, 5, step, rank))


PATHS = [floor_share_drops_the_rest, seed_plus_rank, same_seed_on_every_rank, no_ito_term, global_torch_seed,
         seeded_by_rank_and_step]  # fmt: skip


def mean_of_means(params, loss, count, group=None):
    """Divides the sum of the ranks' mean gradients by the world size: right only when every rank holds as many
    paths (a rank without paths sends zeros, so the collectives still match)."""
    params = [p for p in params if p.requires_grad]
    n = dist.get_world_size(group)
    has = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(has, group=group)
    for p, h in zip(params, has):
        if h > 0:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g, group=group)
            p.grad = g / n
    t = torch.tensor([0.0 if math.isnan(loss) else loss])
    dist.all_reduce(t, group=group)
    return float(t) / n


def nan_from_the_empty_rank(params, loss, count, group=None):
    """Weights the loss by count, but a rank without paths sends nan * 0 = nan."""
    params = [p for p in params if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) * count for p in params]
                     + [torch.tensor([loss * count, float(count)])])  # fmt: skip
    dist.all_reduce(flat, group=group)
    total, offset = flat[-1], 0
    for p in params:
        p.grad = (flat[offset : offset + p.numel()] / total).view_as(p).clone()
        offset += p.numel()
    return float(flat[-2] / total)


def _weighted(params, loss, count, group, gather=False, flag=True):
    params = [p for p in params if p.requires_grad]
    has = [float(p.grad is not None) for p in params]
    flat = torch.cat([(p.grad if p.grad is not None and count else torch.zeros_like(p)).reshape(-1) * count
                      for p in params] + [torch.tensor([loss * count if count else 0.0, float(count)] + has)])  # fmt: skip
    if gather:  # every rank's whole buffer to every rank, then the sum: (n - 1) x the bytes of one all-reduce
        parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, flat, group=group)
        flat = torch.stack(parts).sum(0)
    else:
        dist.all_reduce(flat, group=group)
    k = len(params)
    total, offset = flat[-k - 1], 0
    for i, p in enumerate(params):
        if flat[len(flat) - k + i] > 0 or not flag:
            p.grad = (flat[offset : offset + p.numel()] / total).view_as(p).clone()
        offset += p.numel()
    return float(flat[-k - 2] / total)


def all_gather_then_sum(params, loss, count, group=None):
    """Right numbers, but all_gather of every rank's gradients: (n - 1) x one all-reduce's bytes on the wire."""
    return _weighted(params, loss, count, group, gather=True)


def grads_for_unused_parameters(params, loss, count, group=None):
    """Sets p.grad (zeros) for a parameter no rank has a gradient for."""
    return _weighted(params, loss, count, group, flag=False)


GRAD_AVERAGE = [mean_of_means, nan_from_the_empty_rank, all_gather_then_sum, grads_for_unused_parameters]

# ---- the milestone with pieces: answers refused before any run is re-made ----


def _given():
    from simlib.projects.finance.pieces import average_by_count, rank_paths

    return {"paths": rank_paths, "grad_average": average_by_count}


def no_pieces_in_the_answer():
    """(task, record, state): the plain milestone's answer, with no pieces."""
    return (None, None, None)


def one_slot_left_to_the_course():
    """The course's grad_average left in (the slot missing): the milestone is not earned by the course's code."""
    return (None, None, None, {"paths": _given()["paths"]})


def a_wrong_piece():
    """Pieces for every slot, one of them wrong: its own check fails first."""
    return (None, None, None, {"paths": no_ito_term, "grad_average": _given()["grad_average"]})


MILESTONE = [no_pieces_in_the_answer, one_slot_left_to_the_course, a_wrong_piece]  # each builds its answer
