"""ZeRO-3 with prefetching: the next block's all-gather in flight while the current block computes.

The course's :class:`~simlib.parallel.zero3.Zero3` gathers a block's parameters just before the block runs
(forward) and again just before its backward, and waits for each all-gather: the communication is all exposed.
FSDP hides most of it by *prefetching*: when block i starts its forward, issue the (asynchronous) all-gather of
block i+1; when block i starts its backward, issue block i-1's. The block that comes next then finds its
parameters arrived, or waits only for the rest.

Two rules keep the answer right: the prefetched buffer may be used only after its all-gather is waited for
(:func:`wait_gather`, which :class:`Zero3Prefetch` makes every gather do first), and it must not be freed while
the all-gather writes into it. Lesson 09b's exercise writes :meth:`Zero3Prefetch.on_forward` and
:meth:`Zero3Prefetch.on_backward` (``solutions/09b_zero3_prefetch.ipynb``); ``counts`` tells how many gathers were
prefetched and how many had to wait from scratch, and :mod:`simlib.debug.trace` shows the hidden time.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .zero import _count, all_gather_shards
from .zero3 import Zero3


def issue_gather(unit) -> bool:
    """Start the all-gather of ``unit``'s full parameters without waiting (``async_op=True``); the handle is kept
    on the unit. Returns False when there is nothing to do (already gathered, or already in flight)."""
    if unit.gathered() or getattr(unit, "work", None) is not None:
        return False
    unit.full.untyped_storage().resize_(unit.full.numel() * unit.full.element_size())
    _count(unit.comm_counter, "all_gather", unit.full)
    unit.source_buffer = unit.source()  # (cast to the compute dtype under a policy): alive until the wait
    unit.work = all_gather_shards(unit.full, unit.source_buffer, group=unit.group, async_op=True)
    return True


def wait_gather(unit) -> bool:
    """Wait for ``unit``'s prefetched all-gather, if one is in flight. Returns whether one was."""
    work = getattr(unit, "work", None)
    if work is None:
        return False
    unit.work = None
    work.wait()
    return True


class Zero3Prefetch(Zero3):
    """:class:`Zero3` whose blocks prefetch their neighbour's parameters (forward: the next; backward: the
    previous), under the same mixed-precision policy (``param_dtype``, ``reduce_dtype``: FSDP2's
    ``MixedPrecisionPolicy``; a prefetched gather sends the shard already cast). ``counts``: ``{"prefetched":
    gathers found in flight, "waited": gathers started from scratch}``; ``blocked_s``: the time the main thread
    spent waiting for all-gathers (what prefetching is meant to cut)."""

    def __init__(
        self,
        module: nn.Module,
        blocks=None,
        group=None,
        comm_counter=None,
        param_dtype=None,
        reduce_dtype=torch.float32,
    ):
        super().__init__(
            module,
            blocks=blocks,
            group=group,
            comm_counter=comm_counter,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
        )
        # the blocks in forward order, each a list of its units (one per kind of parameter); the root comes last
        self.blocks = []
        for u in self.units:
            if u.name and (not self.blocks or self.blocks[-1][0].module is not u.module):
                self.blocks.append([])
            if u.name:
                self.blocks[-1].append(u)
        self.counts = {"prefetched": 0, "waited": 0}
        self.blocked_s = 0.0  # seconds this rank's main thread waited for all-gathers (exposed all-gather time)
        for unit in self.units:
            unit.work = None
            unit.gather = self._gather_of(unit, unit.gather)
        for i, units in enumerate(self.blocks):
            # after Zero3's own hooks (registered first): block i's parameters are in place when these run
            units[0].module.register_forward_pre_hook(lambda module, args, i=i: self.on_forward(i))
            units[0].module.register_forward_hook(lambda module, args, output, i=i: self._hook_backward(output, i))
        # the root (embeddings, head) runs first in forward and first in backward: it starts block 0's forward
        # gather (as position -1) and the last block's backward gather (as position len(blocks))
        self.module.register_forward_pre_hook(lambda module, args: self.on_forward(-1))
        self.module.register_forward_hook(lambda module, args, output: self._hook_backward(output, len(self.blocks)))

    def _gather_of(self, unit, gather):
        counts = self.counts

        def gather_waiting_first():
            t0 = time.perf_counter()
            if wait_gather(unit):
                counts["prefetched"] += 1
            elif not unit.gathered():
                counts["waited"] += 1
            gather()  # returns at once when the prefetch filled the buffer
            self.blocked_s += time.perf_counter() - t0

        return gather_waiting_first

    def _hook_backward(self, output, i):
        if not torch.is_grad_enabled():
            return output
        outs = output if isinstance(output, (tuple, list)) else (output,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda grad, i=i: (self.on_backward(i), grad)[1])
        return output

    def on_forward(self, i: int) -> None:
        """Block ``i`` is about to run its forward, its parameters gathered (``i = -1``: the root, before block
        0): start the all-gather of the block whose forward comes next."""
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i: int) -> None:
        """Block ``i`` is about to run its backward (``i = len(blocks)``: the root, before the last block): start
        the all-gather of the block whose backward comes next."""
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)
