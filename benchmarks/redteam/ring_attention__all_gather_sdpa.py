# exercise: ring_attention
# kind: fool
# mistake: no ring: all-gathers the whole K and V onto every rank and calls SDPA with the right causal offset: right numbers, but the whole sequence's K/V resident on every rank (what ring attention avoids).
import torch
import torch.distributed as dist


def ring_attention(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(n)]
    vs = [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    K, V = torch.cat(ks, -2), torch.cat(vs, -2)
    L = q.shape[-2]
    mask = None
    if causal:
        qi = torch.arange(L) + rank * L
        mask = qi[:, None] >= torch.arange(n * L)[None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=mask)


ANSWER = ring_attention
