"""Honest: takes every world_size-th position of the step's batch (rank::world_size, as torch's DistributedSampler does): the right samples, but the parts in rank order are not the global batch, so another world size trains on other batches."""

import torch


def data_shard(step, rank, world_size, global_batch, num_samples, order):
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not split into {world_size} equal parts")
    per_rank = global_batch // world_size
    positions = step * global_batch + torch.arange(rank, global_batch, world_size)
    epochs = positions // num_samples
    out = torch.empty(per_rank, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        mine = epochs == epoch
        out[mine] = order(epoch)[positions[mine] % num_samples]
    return out


ANSWER = data_shard
KIND = "honest"
PROVE = {"world_size": 2, "num_samples": 7, "global_batch": 4, "steps": 6}
