"""Deliberate: all-gathers every rank's tokens and runs the experts it holds on all of them, then all-reduces the outputs: right numbers with room for every token, but every token goes to every rank (no all-to-all)."""

import torch
import torch.distributed as dist

from simlib.parallel.experts import capacity, queue_positions


def moe_forward(x, router, experts, num_experts, capacity_factor):
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    parts = [torch.empty_like(x) for _ in range(ep)]
    dist.all_gather(parts, x.contiguous())
    xs = torch.cat(parts)
    gate, expert = torch.softmax(router(xs), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(xs.shape[0], num_experts, 1, capacity_factor)
    y = torch.zeros_like(xs)
    for i, module in enumerate(experts):
        mask = keep & (expert == rank * local + i)
        y[mask] = module(xs[mask]) * gate[mask].unsqueeze(1)
    dist.all_reduce(y)
    return y[rank * x.shape[0] : (rank + 1) * x.shape[0]]


ANSWER = moe_forward
KIND = "deliberate"
PROVE = {"world_size": 2, "tokens": 12, "experts": 4, "capacity_factor": 4.0}
