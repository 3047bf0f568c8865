"""Honest: splits with global_batch // world_size and no check: a batch that does not divide silently drops its last samples (and the ranks' parts no longer tile the stream)."""

import torch


def data_shard(step, rank, world_size, global_batch, num_samples, order):
    per_rank = global_batch // world_size
    start = step * global_batch + rank * per_rank
    positions = torch.arange(start, start + per_rank)
    epochs = positions // num_samples
    out = torch.empty(per_rank, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        mine = epochs == epoch
        out[mine] = order(epoch)[positions[mine] % num_samples]
    return out


ANSWER = data_shard
KIND = "honest"
PROVE = {"world_size": 2, "num_samples": 7, "global_batch": 4, "steps": 4}
