"""Wrong answers to exercise 09 (ring attention's forward)."""

from _common import answer

EXERCISE, NOTEBOOK = "ring_attention", "09_ring_attention"


def _ring(direction=1, lse_start=float("-inf"), merge="online"):
    """The solution's loop with one thing changed: the ring's direction, the starting lse, or the merge."""
    import torch
    import torch.distributed as dist

    from simlib.parallel.context import block_attention

    def ring_attention(q, k, v, causal):
        rank, n = dist.get_rank(), dist.get_world_size()
        scale = q.shape[-1] ** -0.5
        local = q.shape[-2]
        diagonal = torch.ones(local, local, dtype=torch.bool).triu(1)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], lse_start, dtype=q.dtype)
        num, den = torch.zeros_like(q), torch.zeros(q.shape[:-1], dtype=q.dtype)
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:
                nk, nv = torch.empty_like(k), torch.empty_like(v)
                to, frm = (rank + direction) % n, (rank - direction) % n
                reqs = dist.batch_isend_irecv(
                    [
                        dist.P2POp(dist.isend, k, to),
                        dist.P2POp(dist.isend, v, to),
                        dist.P2POp(dist.irecv, nk, frm),
                        dist.P2POp(dist.irecv, nv, frm),
                    ]
                )
            block = None
            if not causal or src < rank:
                block = block_attention(q, k, v, scale)
            elif src == rank:
                block = block_attention(q, k, v, scale, diagonal)
            if block is not None:
                bo, bl = block
                if merge == "online":
                    new = torch.logaddexp(lse, bl)
                    out = out * torch.exp(lse - new).unsqueeze(-1) + bo * torch.exp(bl - new).unsqueeze(-1)
                    lse = new
                else:  # weights exp(lse) without subtracting a running max
                    w = torch.exp(bl)
                    num = num + bo * w.unsqueeze(-1)
                    den = den + w
            if step < n - 1:
                for r in reqs:
                    r.wait()
                k, v = nk, nv
        return out if merge == "online" else num / den.unsqueeze(-1)

    return ring_attention


@answer("honest")
def ring_turns_the_wrong_way():
    """Honest: sends to rank - 1 and receives from rank + 1 but still believes it holds block (r - s) (wrong causal blocks)."""
    return _ring(direction=-1)


@answer("honest")
def lse_starts_at_zero():
    """Honest: the running log-sum-exp starts at 0 instead of -inf (an extra phantom block of weight 1)."""
    return _ring(lse_start=0.0)


@answer("honest")
def softmax_weights_without_the_max():
    """Honest: merges blocks with weights exp(block_lse) summed directly (no running max: overflows on large scores)."""
    return _ring(merge="naive")


@answer("deliberate")
def ring_collects_blocks_then_sdpa():
    """Deliberate: passes K/V around the ring (neighbours only) but keeps every block and calls SDPA on the whole K/V."""
    import torch
    import torch.distributed as dist

    def ring_attention(q, k, v, causal):
        rank, n = dist.get_rank(), dist.get_world_size()
        local = q.shape[-2]
        ks, vs = {rank: k}, {rank: v}
        for step in range(n - 1):
            nk, nv = torch.empty_like(k), torch.empty_like(v)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k, (rank + 1) % n),
                    dist.P2POp(dist.isend, v, (rank + 1) % n),
                    dist.P2POp(dist.irecv, nk, (rank - 1) % n),
                    dist.P2POp(dist.irecv, nv, (rank - 1) % n),
                ]
            )
            for r in reqs:
                r.wait()
            k, v = nk, nv
            ks[(rank - step - 1) % n], vs[(rank - step - 1) % n] = k, v
        K = torch.cat([ks[r] for r in range(n)], dim=-2)
        V = torch.cat([vs[r] for r in range(n)], dim=-2)
        mask = None
        if causal:
            qpos = torch.arange(local) + rank * local
            mask = torch.arange(n * local)[None, :] <= qpos[:, None]
        return torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=mask)

    return ring_attention


@answer("deliberate")
def library_ring_attention():
    """Deliberate: calls the course's simlib.parallel.context.ring_attention instead of writing the ring."""
    from simlib.parallel import context

    def ring_attention(q, k, v, causal):
        return context.ring_attention(q, k, v, causal)

    return ring_attention


@answer("deliberate")
def ring_pass_then_numpy_attention():
    """Deliberate: passes K/V around the ring but copies each block to NumPy (outside torch) and does plain attention there."""
    import numpy as np
    import torch
    import torch.distributed as dist

    def ring_attention(q, k, v, causal):
        rank, n = dist.get_rank(), dist.get_world_size()
        local = q.shape[-2]
        ks, vs = {rank: k.numpy().copy()}, {rank: v.numpy().copy()}
        for step in range(n - 1):
            nk, nv = torch.empty_like(k), torch.empty_like(v)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k, (rank + 1) % n),
                    dist.P2POp(dist.isend, v, (rank + 1) % n),
                    dist.P2POp(dist.irecv, nk, (rank - 1) % n),
                    dist.P2POp(dist.irecv, nv, (rank - 1) % n),
                ]
            )
            for r in reqs:
                r.wait()
            k, v = nk, nv
            src = (rank - step - 1) % n
            ks[src], vs[src] = k.numpy().copy(), v.numpy().copy()
        K = np.concatenate([ks[r] for r in range(n)], axis=-2).astype(np.float64)
        V = np.concatenate([vs[r] for r in range(n)], axis=-2).astype(np.float64)
        s = q.numpy().astype(np.float64) @ np.swapaxes(K, -1, -2) * q.shape[-1] ** -0.5
        if causal:
            s = np.where(np.arange(n * local)[None, :] > (np.arange(local) + rank * local)[:, None], -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy((s / s.sum(-1, keepdims=True)) @ V).to(q.dtype)

    return ring_attention
