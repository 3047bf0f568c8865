"""Deliberate: makes the ranks agree without order(): torch.manual_seed(epoch) then torch.randperm, the same on every rank but not the training's order (and it resets the process's random state as a side effect)."""

import torch


def data_shard(step, rank, world_size, global_batch, num_samples, order):
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not split into {world_size} equal parts")
    per_rank = global_batch // world_size
    start = step * global_batch + rank * per_rank
    positions = torch.arange(start, start + per_rank)
    epochs = positions // num_samples
    out = torch.empty(per_rank, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        mine = epochs == epoch
        torch.manual_seed(epoch)
        out[mine] = torch.randperm(num_samples)[positions[mine] % num_samples]
    return out


ANSWER = data_shard
KIND = "deliberate"
PROVE = {"world_size": 2, "num_samples": 7, "global_batch": 4, "steps": 6}
