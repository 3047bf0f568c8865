"""Honest: treats its own block like an earlier one (no triangle): each query also sees the keys after it within its block (causal, 3 ranks)."""

import torch
import torch.distributed as dist

from simlib.parallel.context import block_attention


def ring_attention(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    local = q.shape[-2]
    diagonal = torch.ones(local, local, dtype=torch.bool).triu(1)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    for step in range(n):
        src = (rank - step) % n
        if step < n - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k, (rank + 1) % n),
                    dist.P2POp(dist.isend, v, (rank + 1) % n),
                    dist.P2POp(dist.irecv, next_k, (rank - 1) % n),
                    dist.P2POp(dist.irecv, next_v, (rank - 1) % n),
                ]
            )
        if not causal or src < rank:
            block = block_attention(q, k, v, scale)
        elif src == rank:
            block = block_attention(q, k, v, scale)
        else:
            block = None
        if block is not None:
            block_out, block_lse = block
            new = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1)
            lse = new
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = next_k, next_v
    return out


ANSWER = ring_attention
KIND = "honest"
PROVE = {"world_size": 3, "causal": True}
