# exercise: moe_dispatch
# kind: fool
# mistake: no all-to-all: all-gathers every rank's tokens, runs the local experts on the whole global batch and all-reduces the outputs: right numbers, n times the traffic and memory of expert parallelism; assumes equal batch per rank.
import torch
import torch.distributed as dist

from simlib.parallel.experts import capacity, queue_positions


def moe_forward(x, router, experts, num_experts, capacity_factor):
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
    b = x.shape[0]

    def gather(t):
        out = [torch.empty_like(t) for _ in range(ep)]
        dist.all_gather(out, t.contiguous())
        return torch.cat(out)

    X, E, G, K = gather(x), gather(expert), gather(gate), gather(keep.to(torch.int64)).bool()
    Y = torch.zeros_like(X)
    for j, module in enumerate(experts):
        sel = K & (E == rank * local + j)
        if sel.any():
            Y[sel] = module(X[sel]) * G[sel].unsqueeze(1)
    dist.all_reduce(Y)
    return Y[rank * b : (rank + 1) * b].clone()


ANSWER = moe_forward
