"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

A router scores each token against ``E`` experts (small MLPs); each token goes to its ``top_k`` experts and the
layer's output is the gate-weighted sum of their outputs (Shazeer et al. 2017; Switch Transformer, Fedus et al.
2021, for k = 1; GShard, Lepikhin et al. 2020). Each expert takes at most ``capacity = ceil(capacity_factor ·
tokens · k / E)`` tokens of the batch; the rest are **dropped** (their output from this layer is zero, so only
the residual connection around the layer carries them). First choices are served before second choices, and
within a choice earlier tokens first, over the *whole* batch — so the layer on ``ep`` ranks drops exactly the
tokens the one-process layer drops.

With expert parallelism each of ``ep`` ranks holds ``E / ep`` experts and its own tokens. One all-to-all sends
each kept (token, choice) to the rank holding its expert (**dispatch**), the experts run, and a second
all-to-all brings the outputs home (**combine**); backward runs both in reverse. The router is replicated
(data-parallel: all-reduce its gradient). The Switch auxiliary loss ``E · Σ_e f_e · P_e`` (f_e: share of
assignments routed to expert e, P_e: mean router probability of e, both over the whole batch) pushes the
router towards an even load; each rank returns its share so that the shares add up to it.

In a model (:class:`MoEFeedForward`, the GPT's MoE variant), the ranks that hold parts of one batch (``dp x cp``
in the trainer) route over that whole batch (``batch_group``: the capacity, the queue and the auxiliary loss's
``f_e`` over every token of the step, as in the one-process layer — "global-batch" load balancing, Qiu et al.
2025), while the experts are shared out over a smaller ``ep`` group; the auxiliary loss reaches the backward
through :class:`AuxLossScaler` (Megatron-Core's ``MoEAuxLossAutoScaler``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..models import FeedForward
from .all_to_all import AllToAll, exchange_counts, group_rank_size
from .comm_log import CommLog


def capacity(tokens: int, num_experts: int, top_k: int = 1, capacity_factor: float = 1.25) -> int:
    """Tokens one expert may take from a batch of ``tokens``: ceil(factor · tokens · k / E)."""
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def route(logits: torch.Tensor, top_k: int):
    """Router probabilities, and each token's top-k gates and experts (gates renormalised to 1 when k > 1)."""
    probs = torch.softmax(logits, dim=-1)
    gates, experts = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    return probs, gates, experts


def queue_positions(
    experts: torch.Tensor, num_experts: int, group=None, distributed: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each (token, choice)'s place in its expert's queue over the whole batch, and the global counts (k, E).

    ``distributed=False``: this process holds the whole batch (even inside a worker of a process group).

    Order: every first choice before any second choice; within a choice, rank 0's tokens first, then rank 1's,
    each rank's in token order — the order of the whole batch in one process.
    """
    rank, n = group_rank_size(group) if distributed else (0, 1)
    tokens, k = experts.shape
    one_hot = nn.functional.one_hot(experts, num_experts).transpose(0, 1)  # (k, T, E)
    local = one_hot.sum(1)  # (k, E)
    if n > 1:
        every = [torch.empty_like(local) for _ in range(n)]
        dist.all_gather(every, local.contiguous(), group=group)
        every = torch.stack(every)  # (ranks, k, E)
    else:
        every = local.unsqueeze(0)
    totals = every.sum(0)  # (k, E) over the whole batch
    before = totals.cumsum(0) - totals + every[:rank].sum(0)  # earlier choices + earlier ranks
    within = one_hot.cumsum(1) - one_hot  # earlier tokens of this rank
    pos = ((within + before.unsqueeze(1)) * one_hot).sum(-1).transpose(0, 1)  # (T, k)
    return pos, totals


def load_balancing_loss(probs: torch.Tensor, totals: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """This rank's share of the Switch loss E · Σ_e f_e P_e (the shares over ranks add up to the loss).

    f_e = assignments to e / (tokens · k) over the whole batch (no gradient, as in Switch), P_e = mean router
    probability of e: this rank contributes its tokens' probabilities over the global token count.
    """
    num_experts = probs.shape[-1]
    f = totals.sum(0).to(probs.dtype) / totals.sum()
    return num_experts * (f * probs.sum(0)).sum() / global_tokens


def _check(num_experts, top_k, capacity_factor, ep, rank):
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"rank {rank}: top_k must be between 1 and the number of experts ({num_experts}), got {top_k}")
    if capacity_factor <= 0:
        raise ValueError(
            f"rank {rank}: capacity_factor must be > 0 (1.0: room for an even split), got {capacity_factor}"
        )
    if num_experts % ep:
        ok = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise ValueError(
            f"rank {rank}: {num_experts} experts do not split evenly over {ep} expert-parallel ranks: "
            f"use ep in {ok}, or a number of experts divisible by {ep}"
        )


LOCAL = "local"  # batch_group: this rank holds the whole batch


def _routing(experts, num_experts, batch_group, ep_group):
    """(queue positions, global counts, tokens in the batch) over ``batch_group`` ("ep": the ep group)."""
    if batch_group == LOCAL:
        pos, totals = queue_positions(experts, num_experts, distributed=False)
    else:
        pos, totals = queue_positions(experts, num_experts, ep_group if batch_group == "ep" else batch_group)
    return pos, totals, int(totals[0].sum())


class MoE(nn.Module):
    """Top-k routed experts in one process: ``forward(x) -> (y, aux_loss, stats)``; x is (..., hidden).

    ``batch_group`` (attribute): ``"local"`` (this process holds the whole batch) or the process group whose
    ranks hold the parts of the batch (routing, capacity and the auxiliary loss over all of them). Every
    expert runs, on no token too, so each has a gradient (zeros) whatever the routing, as on many ranks.
    """

    def __init__(
        self,
        hidden: int = 32,
        num_experts: int = 4,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        ffn: int | None = None,
    ):
        super().__init__()
        _check(num_experts, top_k, capacity_factor, 1, 0)
        self.hidden, self.num_experts, self.top_k, self.capacity_factor = hidden, num_experts, top_k, capacity_factor
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(hidden, ffn) for _ in range(num_experts))
        self.batch_group = LOCAL

    def forward(self, x):
        flat = x.reshape(-1, self.hidden)
        probs, gates, experts = route(self.router(flat), self.top_k)
        pos, totals, global_tokens = _routing(experts, self.num_experts, self.batch_group, None)
        cap = capacity(global_tokens, self.num_experts, self.top_k, self.capacity_factor)
        keep = pos < cap
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, choice = torch.nonzero((experts == e) & keep, as_tuple=True)
            y = y.index_add(0, token, expert(flat[token]) * gates[token, choice].unsqueeze(-1))
        stats = dict(
            capacity=cap,
            tokens_per_expert=(
                (experts.unsqueeze(-1) == torch.arange(self.num_experts, device=x.device)) & keep.unsqueeze(-1)
            )
            .sum((0, 1))
            .tolist(),
            dropped=int((~keep).sum()),
            assignments=keep.numel(),
        )
        return y.view_as(x), load_balancing_loss(probs, totals, global_tokens), stats


class ExpertParallelMoE(nn.Module):
    """The same layer with ``E / ep`` experts on each rank of ``group`` and each rank's own tokens.

    ``forward(x_local) -> (y_local, aux_share, stats)``; all-to-alls are recorded in ``log`` (an
    :class:`CommLog`); ``stats`` has the tokens each local expert received, the dropped assignments and
    the rows sent to / received from each rank.
    """

    def __init__(
        self,
        router: nn.Linear,
        experts: nn.ModuleList,
        num_experts: int,
        top_k: int,
        capacity_factor: float,
        group=None,
        log: CommLog | None = None,
        engine: str = "native",
        batch_group="ep",
    ):
        super().__init__()
        rank, ep = group_rank_size(group)
        _check(num_experts, top_k, capacity_factor, ep, rank)
        self.router, self.experts = router, experts
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.group, self.log, self.engine = group, log, engine
        self.batch_group = batch_group  # "ep": each rank of ``group`` holds its part of the batch; see MoE
        self.local = num_experts // ep
        self.first = rank * self.local  # global index of this rank's first expert

    @classmethod
    def from_dense(cls, moe: MoE, group=None, log=None, engine="native", batch_group="ep"):
        """Keep the router and this rank's experts (experts r·E/ep ... (r+1)·E/ep - 1) of a :class:`MoE`."""
        rank, ep = group_rank_size(group)
        _check(moe.num_experts, moe.top_k, moe.capacity_factor, ep, rank)
        local = moe.num_experts // ep
        return cls(
            moe.router,
            nn.ModuleList(moe.experts[rank * local : (rank + 1) * local]),
            moe.num_experts,
            moe.top_k,
            moe.capacity_factor,
            group,
            log,
            engine,
            batch_group,
        )

    def forward(self, x):
        rank, ep = group_rank_size(self.group)
        hidden = x.shape[-1]
        flat = x.reshape(-1, hidden)
        probs, gates, experts = route(self.router(flat), self.top_k)
        pos, totals, global_tokens = _routing(experts, self.num_experts, self.batch_group, self.group)
        cap = capacity(global_tokens, self.num_experts, self.top_k, self.capacity_factor)
        token, choice = torch.nonzero(pos < cap, as_tuple=True)  # kept assignments
        expert = experts[token, choice]
        order = torch.argsort(expert, stable=True)  # grouped by expert, hence by rank
        token, choice, expert = token[order], choice[order], expert[order]
        # dispatch: how many rows go to each rank, and per expert of that rank
        per_expert = torch.bincount(expert, minlength=self.num_experts)
        received = exchange_counts(per_expert.view(ep, self.local).reshape(-1), self.group).view(ep, self.local)
        send_splits = per_expert.view(ep, self.local).sum(1).tolist()
        recv_splits = received.sum(1).tolist()
        rows = AllToAll.apply(flat[token], send_splits, recv_splits, self.group, self.log, "dispatch", self.engine)
        # the experts: received rows are grouped by source rank, then by expert
        local_expert = torch.repeat_interleave(
            torch.arange(self.local, device=x.device).repeat(ep), received.reshape(-1)
        )
        out = torch.zeros_like(rows)
        for e, module in enumerate(self.experts):  # every expert runs, on no rows too: backward must reach
            idx = torch.nonzero(local_expert == e, as_tuple=True)[0]  # the dispatch on every rank (it is a collective)
            out = out.index_copy(0, idx, module(rows[idx]))
        back = AllToAll.apply(out, recv_splits, send_splits, self.group, self.log, "combine", self.engine)
        y = torch.zeros_like(flat).index_add(0, token, back * gates[token, choice].unsqueeze(-1))
        stats = dict(
            rank=rank,
            capacity=cap,
            tokens_per_expert=received.sum(0).tolist(),
            dropped=int((pos >= cap).sum()),
            assignments=pos.numel(),
            sent_rows=send_splits,
            received_rows=recv_splits,
        )
        return y.view_as(x), load_balancing_loss(probs, totals, global_tokens), stats


class AuxLossScaler(torch.autograd.Function):
    """``y`` unchanged in forward; in backward, also the gradient of ``aux`` (a scalar already weighted):
    how an auxiliary loss computed inside a layer joins the training loss without the loop knowing of it
    (Megatron-Core's ``MoEAuxLossAutoScaler``)."""

    @staticmethod
    def forward(ctx, y, aux):
        ctx.save_for_backward(aux)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux)


class MoEFeedForward(nn.Module):
    """A mixture-of-experts layer where a transformer's MLP was: ``forward(x) -> y``, (..., hidden) both.

    The Switch auxiliary loss, times ``aux_coeff``, is added to the backward (:class:`AuxLossScaler`), times
    ``aux_scale``: 1 in one process; the trainer sets it (:meth:`over`) so that after its gradient averaging
    the router gets the one-process gradient (the ranks averaged over, over the micro-batches, times the loss
    scale). ``stats`` and ``aux_loss`` hold the last forward's load and auxiliary loss (this rank's share).
    """

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        ffn: int | None = None,
        aux_coeff: float = 0.01,
    ):
        super().__init__()
        self.moe = MoE(hidden, num_experts, top_k, capacity_factor, ffn)
        self.aux_coeff, self.aux_scale = aux_coeff, 1.0
        self.stats, self.aux_loss = None, None

    def forward(self, x):
        y, aux, self.stats = self.moe(x)
        self.aux_loss = aux.detach()
        if self.aux_coeff and torch.is_grad_enabled() and aux.requires_grad:
            y = AuxLossScaler.apply(y, aux * (self.aux_coeff * self.aux_scale))
        return y

    def shard_experts(self, group, log: CommLog | None = None) -> None:
        """Keep this rank's ``E / ep`` experts of ``group`` (size ep); tokens reach them by all-to-all."""
        if isinstance(self.moe, ExpertParallelMoE):
            raise ValueError("the experts are already shared out over a group")
        self.moe = ExpertParallelMoE.from_dense(self.moe, group, log, batch_group=LOCAL)

    @property
    def expert_parameters(self) -> list:
        """The experts' parameters (under expert parallelism, this rank's experts only)."""
        return list(self.moe.experts.parameters())

    @contextmanager
    def over(self, batch_group, aux_scale: float = 1.0):
        """Route over ``batch_group`` (the ranks holding the step's batch) with the loss weighted
        ``aux_scale``, inside the block; outside it every rank holds its whole batch (evaluation)."""
        before = self.moe.batch_group, self.aux_scale
        self.moe.batch_group, self.aux_scale = batch_group, aux_scale
        try:
            yield self
        finally:
            self.moe.batch_group, self.aux_scale = before


def a2a_volume(
    tokens_per_rank: int, hidden: int, top_k: int, ep: int, bytes_per_element: int = 4, kept: float = 1.0
) -> dict:
    """Bytes one rank sends in the dispatch (and again in the combine) under a uniform router.

    Each of its ``tokens · k`` assignments (times the share ``kept`` that fits the capacity) goes to a
    uniformly chosen expert, on another rank with probability (ep - 1)/ep, as ``hidden`` values. Backward
    sends as much again. Returns per-rank bytes for dispatch, combine and a forward+backward step.
    """
    one_way = tokens_per_rank * top_k * kept * (ep - 1) / ep * hidden * bytes_per_element
    return dict(dispatch=one_way, combine=one_way, step=4 * one_way)


def a2a_bytes_from_counts(sent_rows: list[int], rank: int, hidden: int, bytes_per_element: int = 4) -> int:
    """Bytes a rank actually sends in one dispatch, from its rows per destination (its own rows stay)."""
    return (sum(sent_rows) - sent_rows[rank]) * hidden * bytes_per_element
