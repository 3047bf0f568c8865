"""Wrong ring-attention forwards and MoE dispatch/combines (lesson 09)."""

import torch
import torch.distributed as dist

from simlib.parallel.context import block_attention
from simlib.parallel.experts import capacity, queue_positions


def _ring(q, k, v, causal, merge, mask_rule):
    rank, n = dist.get_rank(), dist.get_world_size()
    scale, local = q.shape[-1] ** -0.5, q.shape[-2]
    diagonal = torch.ones(local, local, dtype=torch.bool).triu(1)
    out, lse, blocks = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype), 0
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
        mask = mask_rule(causal, src, rank, diagonal)
        if mask is not False:
            block_out, block_lse = block_attention(q, k, v, scale, mask)
            out, lse = merge(out, lse, block_out, block_lse)
            blocks += 1
        if step < n - 1:
            for r in reqs:
                r.wait()
            k, v = nk, nv
    return out


def _rescale(out, lse, block_out, block_lse):
    new = torch.logaddexp(lse, block_lse)
    return out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1), new


def _right_mask(causal, src, rank, diagonal):
    if not causal or src < rank:
        return None
    return diagonal if src == rank else False


def softmax_not_renormalised(q, k, v, causal):
    """Adds each block's output as it comes: no log-sum-exp rescaling."""
    return _ring(q, k, v, causal, lambda out, lse, bo, bl: (out + bo, lse), _right_mask)


def causal_mask_on_every_block(q, k, v, causal):
    """Applies the triangle to every visible block, also to the earlier ranks' (fully visible) ones."""
    return _ring(
        q,
        k,
        v,
        causal,
        _rescale,
        lambda causal, src, rank, diagonal: (diagonal if src <= rank else False) if causal else None,
    )


def diagonal_block_unmasked(q, k, v, causal):
    """Skips later ranks' blocks but forgets the triangle on its own block."""
    return _ring(
        q,
        k,
        v,
        causal,
        _rescale,
        lambda causal, src, rank, diagonal: (None if src <= rank else False) if causal else None,
    )


def wrong_source_block(q, k, v, causal):
    """Thinks it holds the block of rank (rank + step) mod n, so masks the wrong blocks."""
    return _ring(
        q,
        k,
        v,
        causal,
        _rescale,
        lambda causal, src, rank, diagonal: _right_mask(
            causal, (2 * rank - src) % dist.get_world_size(), rank, diagonal
        ),
    )


RING = {
    f.__name__: f
    for f in (softmax_not_renormalised, causal_mask_on_every_block, diagonal_block_unmasked, wrong_source_block)
}


def _moe(
    x, router, experts, num_experts, capacity_factor, owner, apply_capacity=True, apply_gate=True, drop_late=False
):
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
    # drop_late: every token sent, the ones over capacity zeroed only when they come back
    late = keep.to(x.dtype) if drop_late else torch.ones_like(x[:, 0])
    if not apply_capacity or drop_late:
        keep = torch.ones_like(keep)
    token = torch.nonzero(keep).squeeze(1)
    slot = owner(expert[token], ep, local)  # (rank, local expert) as one index
    token = token[torch.argsort(slot, stable=True)]
    slot = owner(expert[token], ep, local)
    per_slot = torch.bincount(slot, minlength=num_experts)
    received = torch.empty_like(per_slot)
    dist.all_to_all_single(received, per_slot)
    send, recv = per_slot.view(ep, local).sum(1).tolist(), received.view(ep, local).sum(1).tolist()
    rows = x.new_empty(sum(recv), x.shape[1])
    dist.all_to_all_single(rows, x[token].contiguous(), recv, send)
    which = torch.repeat_interleave(torch.arange(local).repeat(ep), received)
    out = torch.empty_like(rows)
    for i, module in enumerate(experts):
        out[which == i] = module(rows[which == i])
    back = x.new_empty(len(token), x.shape[1])
    dist.all_to_all_single(back, out, send, recv)
    y = torch.zeros_like(x)
    y.index_add_(0, token, back * (gate[token].unsqueeze(1) if apply_gate else 1) * late[token].unsqueeze(1))
    return y


def _blocks(e, ep, local):
    return e


def tokens_to_the_wrong_rank(x, router, experts, num_experts, capacity_factor):
    """Round-robin placement: expert e sent to rank e % ep (local expert e // ep)."""
    return _moe(
        x, router, experts, num_experts, capacity_factor, lambda e, ep, local: (e % ep) * local + (e // ep) % local
    )


def capacity_ignored(x, router, experts, num_experts, capacity_factor):
    """Sends every token, however full its expert is."""
    return _moe(x, router, experts, num_experts, capacity_factor, _blocks, apply_capacity=False)


def gate_not_applied(x, router, experts, num_experts, capacity_factor):
    """Adds the experts' outputs without weighing them by the gate."""
    return _moe(x, router, experts, num_experts, capacity_factor, _blocks, apply_gate=False)


def tokens_over_capacity_sent_anyway(x, router, experts, num_experts, capacity_factor):
    """The right output: every token goes to its expert's rank and back, the ones over capacity zeroed only when
    they come back (they cross the wire for nothing)."""
    return _moe(x, router, experts, num_experts, capacity_factor, _blocks, drop_late=True)


MOE = {f.__name__: f for f in (tokens_to_the_wrong_rank, capacity_ignored, gate_not_applied)}
