"""Algorithm contracts: what an answer must communicate, recorded where no name or alias can slip past.

An exercise teaches an algorithm, and a right output does not prove it: a ring attention that all-gathers K/V
and runs attention locally, or an MoE dispatch that all-gathers every token, gives the same numbers. The grader
therefore records every collective and message each rank makes while the answer runs, at torch's dispatcher
(:func:`recorder`): collectives reach it as ``c10d.allreduce_``, ``c10d.alltoall_base_``, ... and messages as
``c10d.send`` / ``c10d.recv_``, whether the answer called ``dist.all_reduce``, an alias it bound before the
grader ran (``from torch.distributed import all_reduce as ar``), ``distributed_c10d`` or a ``ProcessGroup``
method. The recorder is the grader's, so its counts never come from the answer's own attributes.

:func:`contract` then states, per rank, what the exercise allows (``only`` these collectives, messages to
``neighbours`` only, at most ``max_sent`` elements sent, at least ``at_least`` calls of an operation) and
returns the first breach as a sentence, or "" when the rank kept to it.
"""

from __future__ import annotations

# dispatcher op -> the torch.distributed name a learner knows
NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather_coalesced",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "monitored_barrier": "monitored_barrier",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
}


def recorder(keep: bool = False, watch=None, poison: bool = False):
    """A dispatch mode (``with recorder() as rec:``) noting every c10d operation this thread runs:
    ``rec.calls`` holds ``{"op", "peer", "numel", "elements"}`` per call (``peer``: the destination of a send,
    the source of a receive; ``numel``: the largest tensor it moves; ``elements``: all its tensors together);
    ``rec.collectives`` the collectives' names; ``rec.sent`` the elements sent point-to-point.
    ``keep``: ``rec.payloads`` holds a copy of what each send carried, as ``(peer, tensor)``; ``watch(func,
    args)``: called before every operation (aten's included), e.g. to weigh what is alive at that moment;
    ``poison``: fresh buffers (``torch.empty*``) are filled with NaN, so none holds the values of a freed one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls, self.payloads = [], []

        @property
        def collectives(self) -> list:
            return [c["op"] for c in self.calls if c["op"] not in ("send", "recv", "barrier", "monitored_barrier")]

        @property
        def sent(self) -> int:
            return sum(c["numel"] for c in self.calls if c["op"] == "send")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            if name.startswith("c10d."):
                raw = name.split(".", 1)[1].rstrip("_")
                op = NAMES.get(raw, raw)
                peer = int(args[2]) if op in ("send", "recv") and len(args) > 2 and raw != "recv_any_source" else None
                self.calls.append(dict(op=op, peer=peer, numel=_largest(args), elements=_elements(args)))
                if keep and op == "send":
                    self.payloads.append((peer, _first(args).detach().clone()))
            if watch is not None:
                watch(name, args)
            out = func(*args, **(kwargs or {}))
            if poison and name.startswith(("aten.empty", "aten.new_empty")) and out.is_floating_point():
                out.fill_(float("nan"))  # what a fresh buffer holds is undefined: never a freed block's values
            return out

    return Recorder()


def _largest(args) -> int:
    """The largest tensor among a c10d operation's arguments (lists of tensors and lists of lists included)."""
    best = 0
    for a in args:
        if hasattr(a, "numel") and hasattr(a, "shape"):
            best = max(best, a.numel())
        elif isinstance(a, (list, tuple)):
            best = max(best, _largest(a))
    return best


def _elements(args) -> int:
    return sum(
        a.numel()
        if hasattr(a, "numel") and hasattr(a, "shape")
        else _elements(a)
        if isinstance(a, (list, tuple))
        else 0
        for a in args
    )


def _tensors(args) -> list:
    return [
        t
        for a in args
        for t in (
            [a] if hasattr(a, "numel") and hasattr(a, "shape") else _tensors(a) if isinstance(a, (list, tuple)) else []
        )
    ]


def _first(args):
    for a in args:
        if hasattr(a, "numel") and hasattr(a, "shape"):
            return a
        if isinstance(a, (list, tuple)) and (found := _first(a)) is not None:
            return found
    return None


def traffic(calls, world_size: int) -> float:
    """Elements one rank puts on the wire for ``calls``, by nccl-tests' bus factors (PERFORMANCE.md): all-reduce
    2(n-1)/n of the tensor, all-gather and reduce-scatter (n-1)/n of the whole (gathered) tensor, all-to-all
    (n-1)/n, broadcast, reduce and a send the whole tensor; a receive is counted by its sender."""
    n, total = world_size, 0.0
    for c in calls:
        op, e = c["op"], c.get("elements", c["numel"])
        if op.startswith("all_reduce"):
            total += 2 * (n - 1) / n * e
        elif op.startswith(("all_gather", "reduce_scatter")):  # the whole tensor (n parts) and one part: n + 1
            total += (n - 1) / (n + 1) * e
        elif op.startswith("all_to_all"):  # input and output, each the whole
            total += (n - 1) / n * e / 2
        elif op not in ("recv", "barrier", "monitored_barrier"):
            total += e
    return total


def ring_payload_breach(inputs, payloads, rank: int) -> str:
    """The first message of rank ``rank``'s ring all-reduce that does not carry what the ring algorithm sends,
    as a sentence; "" when every one does. ``inputs``: every rank's input, flat; ``payloads``: ``(peer,
    tensor)`` per send, in order. The algorithm's message k is a chunk of the sum over k + 1 consecutive ranks
    of the ring ending at the sender (reduce-scatter: its partial sums), then, from k = n - 1 on, a chunk of the
    sum over all ranks (all-gather: finished chunks); a chunk is any contiguous slice. A ring that carries
    zeros, copies or anything else while the sum arrives by another way breaks it."""
    import torch

    n = len(inputs)
    x = torch.stack([t.reshape(-1).double() for t in inputs])
    for k, (peer, data) in enumerate(payloads):
        got = data.reshape(-1).double()
        if not got.numel():
            continue
        size = min(k + 1, n)
        step = -1 if peer == (rank + 1) % n else 1  # sending right: the partial sum of ranks r - k .. r
        members = sorted({(rank + step * i) % n for i in range(size)})
        want = x[members].sum(0)
        tol = 1e-5 * float(x.abs().max()) * n + 1e-6
        starts = torch.nonzero((want[: want.numel() - got.numel() + 1] - got[0]).abs() <= tol).flatten().tolist()
        if not any(float((want[o : o + got.numel()] - got).abs().max()) <= tol for o in starts):
            what = (
                "the sum over all ranks (a finished chunk, all-gather phase)"
                if size == n
                else f"the partial sum of ranks {members} (reduce-scatter, step {k})"
            )
            return (
                f"rank {rank}'s message {k} to rank {peer} ({got.numel()} elements, first {float(got[0]):.4g}) "
                f"is not a chunk of {what}"
            )
    return ""


def summary(calls) -> dict:
    """``{op: count}`` of a rank's calls."""
    out: dict = {}
    for c in calls:
        out[c["op"]] = out.get(c["op"], 0) + 1
    return out


def contract(
    calls,
    rank: int,
    world_size: int,
    only=None,
    neighbours: bool = False,
    max_sent: int | None = None,
    at_least: dict | None = None,
    small: int | None = None,
) -> str:
    """The first way rank ``rank``'s ``calls`` break the contract, as a sentence; "" when they keep it.

    ``only``: the operations allowed (a call outside them of at most ``small`` elements is tolerated: counts, a
    flag); ``at_least``: ``{"op|other_op": n}``, calls of those operations together."""
    ops = summary(c for c in calls if small is None or only is None or c["op"] in only or c["numel"] > small)
    if only is not None:
        other = sorted(op for op in ops if op not in set(only) | {"barrier"})
        if other:
            return (
                f"rank {rank} called {', '.join(f'{op} ({ops[op]}x)' for op in other)}; this exercise allows only "
                f"{', '.join(sorted(only))}"
            )
    if neighbours:
        near = {(rank + 1) % world_size, (rank - 1) % world_size}
        far = sorted({c["peer"] for c in calls if c["op"] in ("send", "recv") and c["peer"] not in near})
        if far:
            return (
                f"rank {rank} exchanged messages with rank(s) {far}; a ring talks to its neighbours only "
                f"(ranks {sorted(near)})"
            )
    if max_sent is not None:
        sent = sum(c["numel"] for c in calls if c["op"] == "send")
        if sent > max_sent:
            return f"rank {rank} sent {sent:,} elements; the algorithm sends at most {max_sent:,}"
    for names, least in (at_least or {}).items():
        got = sum(ops.get(op, 0) for op in names.split("|"))
        if got < least:
            return (
                f"rank {rank} called {names.replace('|', ' or ')} {got} time(s); the algorithm needs at least {least}"
            )
    return ""


# ---- passes: what a training step really ran (forwards, backwards), from the grader's hooks ----


def watch_passes(model) -> dict:
    """Grader-owned forward hook on ``model``: the rows of every forward, how many of their outputs a backward
    reached, and how many forwards began while an earlier forward's backward had not run yet (activations of two
    micro-batches alive at once). The answer's own counters are never read."""
    passes = dict(forwards=[], backwards=0, overlapped=0, pending=[])

    def backward_reached(grad, token):
        if token in passes["pending"]:
            passes["pending"].remove(token)
            passes["backwards"] += 1
        return grad

    def forward(module, args, output):
        if passes["pending"]:
            passes["overlapped"] += 1
        rows = args[0].shape[0] if args and hasattr(args[0], "shape") and args[0].dim() else 0
        passes["forwards"].append(int(rows))
        if output.requires_grad:
            token = object()
            passes["pending"].append(token)
            output.register_hook(lambda grad, token=token: backward_reached(grad, token))

    model.register_forward_hook(forward)
    return passes


def passes_breach(outs, k) -> str:
    """The first way a rank's steps were not k micro-batch forwards and backwards, one after the other; "" if none."""
    for rank, out in enumerate(outs):
        rows = out["micro_rows"]
        for step, p in enumerate(out["passes"]):
            big = [r for r in p["forwards"] if r > rows]
            if big:
                return f"rank {rank}, step {step}: a forward of {big[0]} samples; a micro-batch has at most {rows}"
            if len(p["forwards"]) != k or p["backwards"] != k:
                return (
                    f"rank {rank}, step {step}: {len(p['forwards'])} forward(s) and {p['backwards']} "
                    f"backward(s), expected {k} of each (k = {k} micro-batches)"
                )
            if p["overlapped"]:
                return (
                    f"rank {rank}, step {step}: {p['overlapped']} forward(s) began before the previous "
                    "micro-batch's backward"
                )
    return ""


class UsedTheLibrary(RuntimeError):
    """The answer reached the course's own implementation of what the exercise asks it to write."""


def _refused(*args, **kwargs):
    # runs as a switched-off library function's code, with that function's module globals (so it imports what it
    # needs) and its name as co_name: say which one was reached
    import sys

    from simlib.grading.contracts import UsedTheLibrary

    raise UsedTheLibrary(
        f"your answer called the course's own {sys._getframe().f_code.co_name}, which is what "
        "the exercise asks you to write: write it yourself (the lesson shows how)"
    )


def switched_off(*functions):
    """A context in which the library's own ``functions`` (plain functions, no closure) refuse to run: their code is
    swapped for one that raises :class:`UsedTheLibrary`, so every alias refuses too (a name bound before the check,
    ``super()``, a method kept in a variable). Used inside the worker, around the answer's run: an answer that
    returns the library's result (``schedules.one_f_one_b``, ``sim.memory_per_device``, ``Zero3Prefetch``'s own
    hooks) proves nothing."""
    import contextlib

    @contextlib.contextmanager
    def swapped():
        saved = {f: f.__code__ for f in functions}
        try:
            for f in functions:
                f.__code__ = _refused.__code__.replace(co_name=f.__name__)
            yield
        finally:
            for f, code in saved.items():
                f.__code__ = code

    return swapped()


def module_functions(module) -> list:
    """The plain functions ``module`` defines (what :func:`switched_off` takes for a whole reference module)."""
    import types

    return [
        f
        for f in vars(module).values()
        if type(f) is types.FunctionType and f.__module__ == module.__name__ and not f.__closure__
    ]


# ---- residency: which blocks of data an answer holds at once, however it holds them ----


def data_census() -> set:
    """The addresses of every tensor storage and NumPy array alive now (what :func:`resident_blocks` leaves out)."""
    from .weighing import _numpy_arrays, _tensor_storages

    return set(_tensor_storages()) | set(_numpy_arrays())


def resident_blocks(blocks: dict, before: set, frames=(), using=()) -> list:
    """The keys of ``blocks`` (``{key: [tensor, ...]}``) of which some tensor is wholly held by data created since
    ``before`` (a :func:`data_census`): a tensor or a NumPy array, in any layout or float dtype, as a copy or inside
    a bigger array (``torch.cat`` of blocks), held by a Python object (a list, a dict, an attribute, ctx), a local
    of one of ``frames``, or among ``using`` (what the operation under way reads). A block is held when both its
    first and its last row (the last axis) are among the values of one such array. Tensors that only C++ keeps
    (a finished request's handle, autograd) and fresh buffers (see ``recorder(poison=True)``) do not count."""
    import gc
    import itertools
    import operator
    import types

    import numpy as np
    import torch

    smallest = min(t.numel() for ts in blocks.values() for t in ts)
    samples = {
        key: [np.concatenate([t.detach().reshape(-1, t.shape[-1])[i].float().numpy() for i in (0, -1)]) for t in ts]
        for key, ts in blocks.items()
    }
    local = [v for f in frames for v in f.f_locals.values()] + list(using)  # a frame's referents omit its locals
    objs = gc.get_objects()
    objs = list(itertools.compress(objs, map(operator.is_not, map(type, objs), itertools.repeat(types.FrameType))))
    pool = gc.get_referents(*objs) + local + gc.get_referents(*local)
    del objs
    nd, kinds = np.ndarray, {torch.Tensor, torch.nn.Parameter, np.ndarray}
    # filtered in C (compress over map): the pool holds millions of referents, a Python loop over them took seconds
    arrays, found = [], {id(r): r for r in itertools.compress(pool, map(kinds.__contains__, map(type, pool)))}
    del pool
    for r in found.values():
        if isinstance(r, torch.Tensor):
            if (
                r.device.type == "cpu"
                and r.is_floating_point()
                and r.numel() >= smallest
                and r.untyped_storage().data_ptr() not in before
            ):
                arrays.append(r.detach().float().numpy().reshape(-1))
        elif type(r) is nd:
            base = r
            while isinstance(base.base, nd):
                base = base.base
            if (
                base.flags.owndata
                and base.ctypes.data not in before
                and base.size >= smallest
                and base.dtype.kind == "f"
            ):
                arrays.append(base.astype(np.float32).reshape(-1))
    return sorted(
        key for key, per in samples.items() if any(any(np.isin(sample, a).all() for a in arrays) for sample in per)
    )
