"""Deliberate: sends every tensor to rank 0 with send/recv, sums there and sends the sum back (point-to-point only, but a star, not a ring: rank 0 moves (n-1) whole tensors each way)."""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(tensor)
        for src in range(1, n):
            dist.recv(buf, src)
            tensor += buf
        for dst in range(1, n):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor


ANSWER = ring_all_reduce
KIND = "deliberate"
PROVE = {"world_size": 3, "shape": [7]}
