"""Honest: allocates the receive buffer with torch.empty(n) in the default float32, so a float64 tensor's chunks are received into a buffer of the wrong dtype (6 float64 elements on 2 ranks: the message sizes differ and Gloo fails)."""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    flat = tensor.view(-1)
    chunks = torch.tensor_split(flat, world_size)
    scratch = torch.empty(chunks[0].numel())
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
PROVE = {"world_size": 2, "shape": [6], "dtype": "float64"}
