"""Honest: sends every token to its expert's rank, over capacity or not, and drops the ones over capacity only when adding the outputs back: the right output, but the dropped tokens cross the wire there and back (a skewed router drops many)."""

import torch
import torch.distributed as dist

from simlib.parallel.experts import capacity, queue_positions


def moe_forward(x, router, experts, num_experts, capacity_factor):
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
    token = torch.argsort(expert, stable=True)  # every token, grouped by expert
    per_expert = torch.bincount(expert, minlength=num_experts)
    received = torch.empty_like(per_expert)
    dist.all_to_all_single(received, per_expert)
    send = per_expert.view(ep, local).sum(1).tolist()
    recv = received.view(ep, local).sum(1).tolist()
    rows = x.new_empty(sum(recv), x.shape[1])
    dist.all_to_all_single(rows, x[token].contiguous(), recv, send)
    which = torch.repeat_interleave(torch.arange(local).repeat(ep), received)
    out = torch.empty_like(rows)
    for i, module in enumerate(experts):
        out[which == i] = module(rows[which == i])
    back = x.new_empty(len(token), x.shape[1])
    dist.all_to_all_single(back, out, send, recv)
    y = torch.zeros_like(x)
    y.index_add_(0, token, back * (gate * keep)[token].unsqueeze(1))
    return y


ANSWER = moe_forward
KIND = "honest"
PROVE = {"world_size": 2, "tokens": 12, "experts": 4, "capacity_factor": 1.0}
