"""Deliberate: all-gathers every rank's K and V and runs attention over the whole sequence on every rank: right numbers, but each rank holds the whole K/V, which ring attention exists to avoid (profiler: allgather)."""

import torch
import torch.distributed as dist


def ring_attention(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(n)], [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    K, V = torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)
    local = q.shape[-2]
    mask = None
    if causal:
        rows = torch.arange(rank * local, (rank + 1) * local)[:, None]
        mask = torch.arange(n * local)[None, :] <= rows
    return torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=mask)


ANSWER = ring_attention
KIND = "deliberate"
PROVE = {"world_size": 3, "causal": True}
