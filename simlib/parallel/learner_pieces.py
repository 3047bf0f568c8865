"""Where a learner's code runs inside the course's training: the adapters of the projects' slots (:mod:`simlib.pieces`).

    grad_sync      ``simlib.parallelize`` builds the learner's data-parallel class instead of
                   ``simlib.parallel.data.wrap``'s (:func:`learner_grad_sync`)
    tp_attention   the GPT's ``tensor_parallel`` splits each block's attention with the learner's class instead of
                   ``simlib.parallel.tensor.tensor_parallel_attention`` (:func:`learner_tp_attention`)

Each adapter checks what the plan needs from the learner's object before any step, and says on which rank, what is
missing and what to do; it never changes the learner's mathematics.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch.distributed as dist
from torch import nn


def _span(timeline, kind, name=None):
    return timeline.span(kind, name=name) if timeline is not None else nullcontext()


class LearnerGradSync(nn.Module):
    """A learner's data-parallel wrapper (the ``grad_sync`` slot) as the training loop uses one: ``forward``,
    ``finish_gradient_synchronization()`` (timed as a "wait" span: what the step waited for the learner's
    all-reduces after backward) and, where the learner's class has it, ``no_sync()``."""

    def __init__(self, inner: nn.Module, timeline=None):
        super().__init__()
        self.inner, self.timeline = inner, timeline
        if hasattr(inner, "no_sync"):
            self.no_sync = inner.no_sync

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        with _span(self.timeline, "wait", "wait for your gradient synchronisation"):
            self.inner.finish_gradient_synchronization()


def learner_grad_sync(piece, model: nn.Module, plan, timeline, group) -> LearnerGradSync:
    """The learner's ``grad_sync`` class built as ``piece(model, bucket_cap_mb=plan.bucket_cap_mb, group=group)``
    (``group=`` left out for a class that takes none, where the data-parallel group is every rank), or a
    ValueError naming what the plan needs that the class lacks."""
    import inspect

    name = getattr(piece, "__name__", type(piece).__name__)
    rank = dist.get_rank()
    try:
        params = inspect.signature(piece).parameters
        takes_group = "group" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes_group = True
    whole_world = dist.get_world_size(group) == dist.get_world_size()
    if not takes_group and not whole_world:
        raise ValueError(
            f"rank {rank}: your grad_sync class {name} takes no group=, but under {plan.label} the data-parallel "
            f"group is {dist.get_world_size(group)} of the {dist.get_world_size()} ranks: add a parameter "
            "group=None and pass it to every dist call (all_reduce(..., group=group), get_world_size(group))"
        )
    if plan.accumulation > 1 and not hasattr(piece, "no_sync"):
        raise ValueError(
            f"rank {rank}: {plan.label} accumulates {plan.accumulation} micro-batches, and your grad_sync "
            f"class {name} has no no_sync(): give it one, or train with accumulation=1"
        )
    kwargs = dict(bucket_cap_mb=plan.bucket_cap_mb, **({"group": group} if takes_group else {}))
    inner = piece(model, **kwargs)
    missing = [m for m in ("finish_gradient_synchronization",) if not callable(getattr(inner, m, None))]
    if not callable(inner) or missing:
        raise ValueError(
            f"rank {rank}: your grad_sync class {name} must be called like the model (forward) and have "
            f"finish_gradient_synchronization(); it lacks {missing or ['__call__ (subclass nn.Module)']}"
        )
    return LearnerGradSync(inner, timeline)


def learner_tp_attention(piece, attn, group, log=None, sequence_parallel: bool = False) -> nn.Module:
    """The learner's ``tp_attention`` class built as ``piece(attn, group)`` from the dense attention ``attn``
    (:class:`simlib.models.SelfAttention`), its split parameters marked (``tensor_parallel_split``) so the gradient
    norm and the saved unsplit weights treat them as the course's own split layers do; a ValueError naming what
    does not fit the contract (``qkv`` and ``out`` Linears holding this rank's heads)."""
    tp = dist.get_world_size(group)
    name = getattr(piece, "__name__", type(piece).__name__)
    if sequence_parallel:
        raise ValueError(
            f"rank {dist.get_rank()}: your tp_attention {name} runs without sequence parallelism; this plan asks for "
            "sequence_parallel=True: train with sequence_parallel=False (or leave the slot to the course's piece)"
        )
    mod = piece(attn, group)
    if not isinstance(mod, nn.Module):
        raise ValueError(f"rank {dist.get_rank()}: your tp_attention {name}(attn, group) must return an nn.Module")
    heads, hidden = attn.num_heads, attn.hidden
    want = {
        "qkv.weight": (3 * hidden // tp, hidden),
        "qkv.bias": (3 * hidden // tp,),
        "out.weight": (hidden, hidden // tp),
        "out.bias": (hidden,),
    }
    got = {k: tuple(p.shape) for k, p in mod.named_parameters()}
    if got != want:
        raise ValueError(
            f"rank {dist.get_rank()}: your tp_attention {name} over {tp} ranks ({heads} heads, hidden {hidden}) must "
            f"hold exactly this rank's share as parameters {want} (self.qkv and self.out, nn.Linear), got {got}"
        )
    params = dict(mod.named_parameters())
    for key in ("qkv.weight", "qkv.bias", "out.weight"):
        params[key].tensor_parallel_split = True  # split over the TP group; out.bias is whole (added once)
    return mod
