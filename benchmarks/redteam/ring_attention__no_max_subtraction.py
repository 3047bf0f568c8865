# exercise: ring_attention
# kind: honest
# mistake: a real ring, but the softmax is accumulated as plain exp(scores) sums without subtracting a running max: overflows to inf/nan in fp32 when scores are large.
import torch
import torch.distributed as dist


def ring_attention(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    L = q.shape[-2]
    num = torch.zeros_like(q)
    den = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype)
    for step in range(n):
        src = (rank - step) % n
        if step < n - 1:
            nk, nv = torch.empty_like(k), torch.empty_like(v)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k, (rank + 1) % n),
                    dist.P2POp(dist.isend, v, (rank + 1) % n),
                    dist.P2POp(dist.irecv, nk, (rank - 1) % n),
                    dist.P2POp(dist.irecv, nv, (rank - 1) % n),
                ]
            )
        if not causal or src <= rank:
            p = torch.exp(q @ k.transpose(-1, -2) * scale)
            if causal and src == rank:
                p = p.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), 0.0)
            num = num + p @ v
            den = den + p.sum(-1, keepdim=True)
        if step < n - 1:
            for r in reqs:
                r.wait()
            k, v = nk, nv
    return num / den


ANSWER = ring_attention
