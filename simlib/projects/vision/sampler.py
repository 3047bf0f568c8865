"""Which samples each rank reads: the vision project's data shard (a learner's piece, slot ``data_shard``).

The training stream is every epoch's shuffled order one after another: epoch 0's order, then epoch 1's, ...; epoch
``e``'s order is a permutation of the ``num_samples`` training samples drawn from ``(seed, e)``, so every rank
computes the same order without a word to the others. Step ``s`` reads the ``global_batch`` positions ``s·B ..
(s+1)·B - 1`` of that stream (a batch near the end of an epoch takes the rest of it and the first samples of the
next; nothing is padded or dropped, so every sample is read exactly once per epoch), and rank ``r`` of ``world_size``
reads the ``r``-th of ``world_size`` equal, contiguous parts of it. The parts of a step, concatenated in rank order,
are the global batch whatever the world size: a 1-, 2- or 4-rank run trains on the very same samples.
"""

from __future__ import annotations

import torch

__all__ = ["data_shard", "epoch_order"]


def epoch_order(seed: int, num_samples: int):
    """``order(epoch)``: the shuffled order of ``epoch`` (a permutation of ``range(num_samples)``), from ``(seed,
    epoch)`` alone, the same on every rank."""
    from ..seeding import generator

    def order(epoch: int) -> torch.Tensor:
        return torch.randperm(num_samples, generator=generator(seed, 1, epoch))

    return order


def data_shard(step: int, rank: int, world_size: int, global_batch: int, num_samples: int, order) -> torch.Tensor:
    """The sample indices rank ``rank`` of ``world_size`` reads at ``step``: ``global_batch // world_size`` of them,
    an int64 tensor (see the module's docstring). ``order(epoch)`` is the epoch's shuffled order."""
    if global_batch % world_size:
        raise ValueError(
            f"global_batch {global_batch} does not split into {world_size} equal parts; "
            f"use a world size (x accumulation) that divides it"
        )
    per_rank = global_batch // world_size
    start = step * global_batch + rank * per_rank  # this rank's first position in the stream
    positions = torch.arange(start, start + per_rank)
    epochs = positions // num_samples
    out = torch.empty(per_rank, dtype=torch.long)
    for epoch in epochs.unique().tolist():  # a part may straddle an epoch's end (or span several)
        mask = epochs == epoch
        out[mask] = order(epoch)[positions[mask] % num_samples]
    return out
