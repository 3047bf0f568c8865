# exercise: ring_attention
# kind: honest
# mistake: causal masking by whole blocks only (src <= rank): the diagonal block is not masked inside, so each query also sees the later keys of its own block.
import torch
import torch.distributed as dist

from simlib.parallel.context import block_attention


def ring_attention(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
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
            bo, bl = block_attention(q, k, v, scale)
            new = torch.logaddexp(lse, bl)
            out = out * torch.exp(lse - new).unsqueeze(-1) + bo * torch.exp(bl - new).unsqueeze(-1)
            lse = new
        if step < n - 1:
            for r in reqs:
                r.wait()
            k, v = nk, nv
    return out


ANSWER = ring_attention
