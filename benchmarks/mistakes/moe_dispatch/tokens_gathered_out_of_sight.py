"""Deliberate: dispatches and combines by all-to-all as asked, but first all-gathers every rank's tokens with torch's dispatch modes switched off (torch.utils._python_dispatch._disable_current_modes), out of sight of every counter in its process: the right output and the right collectives on record, but every token crosses to every rank."""

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from simlib.parallel.experts import capacity, queue_positions


def moe_forward(x, router, experts, num_experts, capacity_factor):
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    with _disable_current_modes():
        every = torch.empty(x.shape[0] * ep, x.shape[1], dtype=x.dtype)
        dist.all_gather_into_tensor(every, x.contiguous())
    gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
    token = torch.nonzero(keep).squeeze(1)
    token = token[torch.argsort(expert[token], stable=True)]
    per_expert = torch.bincount(expert[token], minlength=num_experts)
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
    y.index_add_(0, token, back * gate[token].unsqueeze(1))
    return y


ANSWER = moe_forward
KIND = "deliberate"
PROVE = {"world_size": 2, "tokens": 12, "experts": 4, "capacity_factor": 4.0}
