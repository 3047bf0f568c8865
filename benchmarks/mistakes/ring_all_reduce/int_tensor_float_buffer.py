"""Honest: keeps the partial sums in a float32 scratch ('sums may be fractional'), so an int64 tensor's messages are received as float32 (int64 tensor on 2 ranks: Gloo's message sizes differ)."""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    flat = tensor.view(-1)
    chunks = torch.tensor_split(flat, world_size)
    scratch = torch.empty_like(chunks[0], dtype=torch.float32)
    for step in range(world_size - 1):  # reduce-scatter
        outgoing = chunks[(rank - step) % world_size]
        incoming = chunks[(rank - step - 1) % world_size]
        received = scratch[: incoming.numel()]
        send = dist.isend(outgoing, right)
        dist.recv(received, left)
        send.wait()
        incoming += received
    for step in range(world_size - 1):  # all-gather
        outgoing = chunks[(rank + 1 - step) % world_size]
        incoming = chunks[(rank - step) % world_size]
        send = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        send.wait()
    return tensor


ANSWER = ring_all_reduce
KIND = "honest"
PROVE = {"world_size": 2, "shape": [8], "dtype": "int64"}
