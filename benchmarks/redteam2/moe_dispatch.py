"""Wrong answers to exercise 09 (MoE dispatch and combine)."""

from _common import answer

EXERCISE, NOTEBOOK = "moe_dispatch", "09_moe_dispatch"


def _moe(local_capacity=False, keep_one_more=False, sort_by_expert=True):
    """The solution with one thing changed: capacity from local tokens, <= for <, or no sort by expert."""
    import torch
    import torch.distributed as dist

    from simlib.parallel.experts import capacity, queue_positions

    def moe_forward(x, router, experts, num_experts, capacity_factor):
        rank, ep = dist.get_rank(), dist.get_world_size()
        local = num_experts // ep
        gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
        position = queue_positions(expert[:, None], num_experts)[0][:, 0]
        cap = capacity(x.shape[0] * (1 if local_capacity else ep), num_experts, 1, capacity_factor)
        keep = position <= cap if keep_one_more else position < cap
        token = torch.nonzero(keep).squeeze(1)
        if sort_by_expert:
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

    return moe_forward


@answer("honest")
def capacity_from_local_tokens():
    """Honest: capacity computed from this rank's tokens, not the whole batch's (drops far too many)."""
    return _moe(local_capacity=True)


@answer("honest")
def keeps_position_equal_to_capacity():
    """Honest: keeps tokens with position <= capacity (one token too many per full expert)."""
    return _moe(keep_one_more=True)


@answer("honest")
def kept_tokens_not_sorted_by_expert():
    """Honest: sends the kept tokens in token order, split by per-rank counts, without sorting them by expert."""
    return _moe(sort_by_expert=False)


@answer("deliberate")
def move_the_experts_not_the_tokens():
    """Deliberate: all-gathers every expert's weights (all_gather_object) and runs every token locally, no all-to-all."""
    import copy

    import torch
    import torch.distributed as dist

    from simlib.parallel.experts import capacity, queue_positions

    def moe_forward(x, router, experts, num_experts, capacity_factor):
        ep = dist.get_world_size()
        gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
        position = queue_positions(expert[:, None], num_experts)[0][:, 0]
        keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
        states = [None] * ep
        dist.all_gather_object(states, [e.state_dict() for e in experts])
        every = []
        for rank_states in states:
            for sd in rank_states:
                e = copy.deepcopy(experts[0])
                e.load_state_dict(sd)
                every.append(e)
        y = torch.zeros_like(x)
        for e in range(num_experts):
            sel = torch.nonzero(keep & (expert == e)).squeeze(1)
            if len(sel):
                y[sel] = every[e](x[sel]) * gate[sel].unsqueeze(1)
        return y

    return moe_forward
