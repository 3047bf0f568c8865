"""One log of the collectives a building block issues: one row per call, its bytes and its time.

Tensor parallelism's all-reduces, all-gathers and reduce-scatters, the all-to-alls and ring sends of context and
expert parallelism, and ZeRO's broadcasts, reduces, all-gathers and reduce-scatters are all written here, so a
test or a lesson holds any of them to its formula the same way:

    log = CommLog()
    y = TensorParallelMLP.from_dense(mlp, log=log)(x)       # or ring_attention(..., log=log), Zero3(..., comm_counter=log)
    log.bytes, log.seconds, log.bytes_of("dispatch"), log.bytes_by_name()

A row is a :class:`Call` ``(name, elements, bytes, seconds)``. The block decides what "bytes" means for its
collective and says so (TP: the tensor all-reduced or gathered; all-to-all: what this rank sent to other ranks;
ZeRO: what this rank handed to the collective). With ``timeline``, each timed call is also a "comm" span.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = ["Call", "CommLog"]

# torch 2.13 renamed the tensor-in/tensor-out collectives; older torch (>= 2.4) has the first names only
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Call(NamedTuple):
    name: str
    elements: int
    bytes: int
    seconds: float


@dataclass
class CommLog:
    """The collectives of a block, one :class:`Call` per call (``calls``)."""

    calls: list = field(default_factory=list)
    timeline: object = None

    # ── recording ──
    def add(self, name: str, what, seconds: float = 0.0, start: float | None = None) -> None:
        """Record a call: ``what`` is a tensor (its elements and bytes) or a number of bytes."""
        if isinstance(what, torch.Tensor):
            elements, nbytes = what.numel(), what.numel() * what.element_size()
        else:
            elements, nbytes = 0, int(what)
        self.calls.append(Call(name, elements, nbytes, seconds))
        if self.timeline is not None and start is not None:
            self.timeline.add("comm", start, start + seconds, name=name)

    def finish_last(self, start: float) -> None:
        """The last call ended now (a ring send recorded when posted, timed when its wait returns)."""
        if self.calls:
            self.calls[-1] = self.calls[-1]._replace(seconds=time.perf_counter() - start)

    # ── logged collectives (tensor and sequence parallelism) ──
    def all_reduce(self, t: torch.Tensor, group, name: str) -> torch.Tensor:
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        self.add(name, t, time.perf_counter() - start, start)
        return t

    def all_gather(self, t: torch.Tensor, group, name: str, dim: int = 1) -> torch.Tensor:
        """Concatenate every rank's ``t`` along ``dim`` (logged: the gathered tensor's bytes)."""
        start = time.perf_counter()
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        local = t.movedim(dim, 0)
        out = t.new_empty((n * local.shape[0], *local.shape[1:]))
        # in place, as FSDP2 gathers: this rank's block of the output is the input. No buffer of its own that
        # Gloo's worker thread would free late (it needs the GIL to), after the peak (simlib.parallel.step_memory)
        mine = out[rank * local.shape[0] : (rank + 1) * local.shape[0]]
        mine.copy_(local)
        _all_gather_tensor(out, mine, group=group)
        self.add(name, out, time.perf_counter() - start, start)
        return out.movedim(0, dim)

    def reduce_scatter(self, t: torch.Tensor, group, name: str, dim: int = 1) -> torch.Tensor:
        """Sum ``t`` over the ranks and keep this rank's block ``rank`` of ``dim`` (logged: ``t``'s bytes)."""
        start = time.perf_counter()
        n = dist.get_world_size(group)
        full = t.movedim(dim, 0).contiguous()
        out = full.new_empty((full.shape[0] // n, *full.shape[1:]))
        _reduce_scatter_tensor(out, full, group=group)
        self.add(name, full, time.perf_counter() - start, start)
        return out.movedim(0, dim)

    # ── reading ──
    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.calls)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.calls)

    def bytes_of(self, prefix: str) -> int:
        """Bytes of the calls whose name starts with ``prefix``."""
        return sum(c.bytes for c in self.calls if c.name.startswith(prefix))

    def bytes_by_name(self) -> dict:
        out: dict = {}
        for c in self.calls:
            out[c.name] = out.get(c.name, 0) + c.bytes
        return out

    def calls_by_name(self) -> dict:
        out: dict = {}
        for c in self.calls:
            out[c.name] = out.get(c.name, 0) + 1
        return out

    def clear(self) -> None:
        self.calls.clear()

    reset = clear
