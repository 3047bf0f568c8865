"""Check for lesson 09b's exercise: prefetching in ZeRO-3 (the next block's all-gather while this one computes).

The exercise is an algorithm, and the right losses do not prove it: a prefetch that gathers every block up front
gives the same numbers with every block's full parameters alive at once. Everything the contract is judged on is
measured by the grader (:func:`gather_tracker`, a dispatch mode that sees every all-gather under any name, and hooks
the grader puts on its own model before the answer is built), never read from the answer's ``counts`` or other
attributes:

- the number of all-gathers, equal to the plain :class:`~simlib.parallel.zero3.Zero3`'s (prefetching changes
  when a block is gathered, never how often);
- whether each block's gather was already issued when the block needed it (its forward, its backward);
- the peak number of gathered (full, non-empty) buffers alive at once, at most the plain Zero3's peak (the root and
  the block running) plus one block's buffers (the one prefetched): the limit comes from the algorithm, measured on
  the plain Zero3 in the same run.
"""

from __future__ import annotations

from .core import Result, _close, exercise

_STEPS = 2


def prefetch_problem():
    """A Hypothesis strategy of the GPT the check trains: 3 or 4 blocks (the middle ones prefetch and are
    prefetched), widths and heads, contexts, a global batch that 2, 3 and 4 ranks divide, a secret seed (weights
    and data windows)."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            num_layers=st.integers(3, 4),  # 2 would hide a prefetch of two blocks ahead (or all): nothing is past one
            hidden=st.sampled_from((32, 48, 64)),
            num_heads=st.sampled_from((2, 4)),
            seq_len=st.integers(12, 32),
            global_batch=st.sampled_from((12, 24)),
            seed=st.integers(0, 2**31 - 1),
        )
    )


def gather_tracker():
    """A dispatch mode (``with gather_tracker() as t:``) that follows every all-gather's output storage (by a weak
    reference: a storage the answer frees stops counting) and, at every operation, how many of them are gathered
    (non-empty). ``t.gathers``: all-gather calls; ``t.peak``: most gathered buffers alive at once;
    ``t.ready(keys)``: which of ``keys`` were filled by an all-gather since they were last seen empty."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    class Tracker(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.refs, self.last_gather, self.last_empty = {}, {}, {}
            self.seq = self.gathers = self.peak = 0

        def _sizes(self) -> dict:
            out = {}
            for key, ref in list(self.refs.items()):
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                if storage is None:  # freed by its owner
                    del self.refs[key]
                    continue
                out[key] = storage.nbytes()
            return out

        def sample(self) -> dict:
            sizes = self._sizes()
            for key, size in sizes.items():
                if not size:
                    self.last_empty[key] = self.seq
            self.peak = max(self.peak, sum(1 for size in sizes.values() if size))
            return sizes

        def ready(self) -> set:
            """The storages gathered now, by an all-gather issued since each was last seen empty."""
            sizes = self.sample()
            return {k for k, size in sizes.items() if size and self.last_gather.get(k, -1) > self.last_empty.get(k, -1)}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seq += 1
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket)
            if name.startswith("c10d.") and "allgather" in name:
                self.gathers += 1
                for t in _tensors(args[0] if args else ()):
                    storage = t.untyped_storage()
                    self.refs[storage._cdata] = StorageWeakRef(storage)
                    self.last_gather[storage._cdata] = self.seq
            self.sample()
            return out

    return Tracker()


def _tensors(x) -> list:
    if hasattr(x, "untyped_storage"):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _watch_blocks(blocks, tracker) -> dict:
    """Grader-owned hooks on the grader's blocks, registered before the answer's: when block i needs its
    parameters (forward, backward) note which gathered storages were ready; after its forward, which storages its
    parameters live in (what block i's gathers fill)."""
    import torch

    seen = {"needs": [], "keys": {i: set() for i in range(len(blocks))}}
    slots = [
        [(m, name) for m in b.modules() for name, p in m._parameters.items() if p is not None and p.requires_grad]
        for b in blocks
    ]

    def need(phase, i):
        seen["needs"].append((phase, i, tracker.ready()))

    def after_forward(module, args, output, i):
        for m, name in slots[i]:
            t = getattr(m, name, None)
            if isinstance(t, torch.Tensor):
                seen["keys"][i].add(t.untyped_storage()._cdata)
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: (need("backward", i), grad)[1])

    for i, b in enumerate(blocks):
        b.register_forward_pre_hook(lambda module, args, i=i: need("forward", i))
        b.register_forward_hook(lambda module, args, output, i=i: after_forward(module, args, output, i))
    return seen


def _prefetch_harness(answer_cls, problem, steps=_STEPS):
    """Train the quick GPT for ``steps`` steps with the course's Zero3 and with ``answer_cls``, each under the
    grader's tracker; return losses, parameters and what the tracker measured."""
    import contextlib

    import torch
    import torch.distributed as dist

    from ..parallel.zero3 import Zero3
    from ..parallel.zero_prefetch import Zero3Prefetch
    from ..projects.gpt.task import GPTTask
    from .contracts import switched_off

    task = GPTTask.quick(**problem)  # its global batch splits over 2, 3 and 4 ranks
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, cls in (("reference", Zero3), ("answer", answer_cls)):
        model = task.build_model()  # seeded: the same weights on every rank and for both
        blocks = task.blocks(model)
        tracker = gather_tracker()
        seen = _watch_blocks(blocks, tracker)  # before the answer's hooks
        z = cls(model, blocks=blocks)
        opt = torch.optim.AdamW(z.parameters(), lr=1e-2)
        losses = []
        # the course's own hooks refuse to run for the answer (its hooks calling super() would be the solution)
        with (
            tracker,
            (
                switched_off(Zero3Prefetch.on_forward, Zero3Prefetch.on_backward)
                if name == "answer"
                else contextlib.nullcontext()
            ),
        ):
            for step in range(steps):
                x, y = task.batch(step, rank, n)
                opt.zero_grad()
                loss = task.loss(z(x), y)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        keys = seen["keys"]
        prefetched = sum(1 for _, i, ready in seen["needs"] if keys[i] and keys[i] <= ready)
        out[name] = {
            "losses": losses,
            "params": z.full_state_dict(),
            "gathers": tracker.gathers,
            "peak": tracker.peak,
            "prefetched": prefetched,
            "needs": len(seen["needs"]),
            "per_block": max((len(k) for k in keys.values()), default=0),
            "blocks": len(blocks),
        }
    return out


def gloo_payload(world_size: int):
    """A dispatch mode (``with gloo_payload(n) as p:``) adding up, in ``p.bytes``, what this rank's collectives put on
    the wire by Gloo's algorithms: an all-gather sends the input to each other rank; a reduce-scatter runs as an
    all-reduce of its input, 2(n-1)/n of it; an all-reduce the same; a broadcast delivers its tensor to the n - 1
    others (a 1/n share of that per rank). Run on the course's own code, for :func:`simlib.grading.wire.beyond`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n = world_size

    class Payload(TorchDispatchMode):
        bytes = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            sizes = [t.numel() * t.element_size() for t in _tensors(list(args))]
            if name.startswith("c10d.") and sizes:
                if "allgather" in name:
                    self.bytes += (n - 1) * min(sizes)
                elif "reduce_scatter" in name or "allreduce" in name:
                    self.bytes += 2 * (n - 1) / n * max(sizes)
                elif "broadcast" in name:
                    self.bytes += (n - 1) / n * sum(sizes)
            return func(*args, **(kwargs or {}))

    return Payload()


def _prefetch_wire_harness(answer_cls, problem):
    """One step of ``answer_cls`` (built in the same run), for the kernel's counters; ``answer_cls`` None: the
    course's own :class:`Zero3Prefetch`, which also says the bytes its collectives carry from this rank."""
    import contextlib

    import torch
    import torch.distributed as dist

    from ..parallel.zero_prefetch import Zero3Prefetch
    from ..projects.gpt.task import GPTTask
    from .contracts import switched_off

    task = GPTTask.quick(**problem)
    rank, n = dist.get_rank(), dist.get_world_size()
    model = task.build_model()
    payload = gloo_payload(n) if answer_cls is None else contextlib.nullcontext()
    with (
        payload,
        switched_off(Zero3Prefetch.on_forward, Zero3Prefetch.on_backward) if answer_cls else contextlib.nullcontext(),
    ):
        z = (answer_cls or Zero3Prefetch)(model, blocks=task.blocks(model))
        opt = torch.optim.AdamW(z.parameters(), lr=1e-2)
        x, y = task.batch(0, rank, n)
        task.loss(z(x), y).backward()
        opt.step()
    return dict(payload=round(payload.bytes)) if answer_cls is None else {}


def _prefetch_wire(answer, grader, problem, world_size) -> Result:
    """Bytes the ranks sent together in one step of the answer (the kernel's counters) against the course's
    Zero3Prefetch on the same problem (:func:`simlib.grading.wire.beyond`): prefetching changes when a block's
    gather runs, never what crosses."""
    from .wire import beyond, per_rank

    name = f"{world_size} ranks: on the wire, one step moves what Zero3 moves (the kernel's counters, all ranks)"
    refs = grader.run(world_size, _prefetch_wire_harness, None, problem, what="the course's Zero3Prefetch", wire=True)
    reference = grader.wire_last
    if reference is not None:
        grader.run(world_size, _prefetch_wire_harness, answer, problem, what="your prefetch, metered", wire=True)
    if reference is None or grader.wire_last is None:
        return Result(name + " (skipped: the kernel's counters cannot be read here)", True)
    breach = beyond(
        [sum(per_rank(grader.wire_last, world_size))],
        [sum(per_rank(reference, world_size))],
        [sum(o["payload"] for o in refs)],
        "one gather of each block's shards per forward and per backward, and the reduce-scatter of its gradients",
    )
    return Result(
        name,
        not breach,
        "a prefetch only moves a block's gather earlier: it must not gather a block twice (a gather started and "
        "thrown away, then started again) nor move anything else",
        breach,
    )


def _prefetch_smallest(answer, grader, problem: dict, world_size: int) -> str:
    """The smallest GPT Hypothesis finds on which the answer's losses or parameters still leave Zero3's (3 runs at
    most, only after a failure); nothing for the tests of planted answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if grader.first_failure:
        return ""

    def fails(p) -> bool:
        try:
            out = grader.run(world_size, _prefetch_harness, answer, p)[0]
        except _Stop:
            return True
        ref, ans = out["reference"], out["answer"]
        return not (
            _close(ans["losses"], ref["losses"], rtol=0, atol=1e-6)
            and all(_close(ans["params"][k], v, rtol=0, atol=1e-6) for k, v in ref["params"].items())
        )

    p = smallest(prefetch_problem(), fails, budget=3, first=problem)
    return (
        f"; smallest failing case found: {world_size} ranks, {p['num_layers']} blocks of width {p['hidden']}, "
        f"{p['num_heads']} heads, context {p['seq_len']}, global batch {p['global_batch']}"
    )


@exercise("zero3_prefetch")
def _check_zero3_prefetch(answer, grader):
    from .instances import draw

    problem = draw(prefetch_problem(), 1)[0]  # drawn now, in this process, from the OS's randomness
    size = f"{problem['num_layers']} blocks of width {problem['hidden']}"
    for world_size in (2, 3, 4):
        outs = grader.run(world_size, _prefetch_harness, answer, problem)
        ref, ans = outs[0]["reference"], outs[0]["answer"]
        bad = [k for k in ref["params"] if not _close(ans["params"][k], ref["params"][k], rtol=0, atol=1e-6)]
        same = _close(ans["losses"], ref["losses"], rtol=0, atol=1e-6) and not bad
        yield Result(
            f"same losses and parameters as Zero3 on {world_size} ranks ({size})",
            same,
            hint="prefetching changes when the parameters arrive, never their values: gather each block's "
            "own shard into its own buffer, and let the block use it only after the gather is waited "
            "for (issue_gather keeps the handle; every gather waits on it first)"
            + ("" if same else _prefetch_smallest(answer, grader, problem, world_size)),
            detail=f"first parameter that differs: {bad[0]}" if bad else f"losses {ans['losses']}",
        )
        expected = 2 * _STEPS * ref["blocks"]  # every block, forward and backward, every step
        short = [
            (r, o["answer"])
            for r, o in enumerate(outs)
            if o["answer"]["prefetched"] != expected or o["answer"]["gathers"] != o["reference"]["gathers"]
        ]
        r, a = short[0] if short else (0, ans)
        yield Result(
            f"every block's all-gather prefetched, forward and backward, on {world_size} ranks",
            not short,
            hint="in forward, block i (i = -1 for the root) starts block i+1's gather; in backward the "
            "order is reversed: block i starts block i-1's. A gather started for the wrong block "
            "arrives too late or is thrown away, and its block waits from scratch",
            detail=f"rank {r}: {a['prefetched']} of {expected} block passes found their gather issued "
            f"before they needed it; {a['gathers']} all-gathers (Zero3: "
            f"{outs[r]['reference']['gathers']}), counted by the grader",
        )
        limits = [o["reference"]["peak"] + o["reference"]["per_block"] for o in outs]
        over = [(r, o["answer"]["peak"], limits[r]) for r, o in enumerate(outs) if o["answer"]["peak"] > limits[r]]
        r, peak, limit = over[0] if over else (0, ans["peak"], ref["peak"] + ref["per_block"])
        yield Result(
            f"at most one block prefetched at a time on {world_size} ranks",
            not over,
            hint=f"rank {r} held {peak} gathered parameter buffers at once; the limit is {limit}: what the "
            f"plain Zero3 holds ({outs[r]['reference']['peak']}: the root and the block running) plus "
            f"one block ({outs[r]['reference']['per_block']} buffers). Prefetching gathers the NEXT "
            "block only, while this one computes; gathering every block up front keeps the whole "
            "model's parameters on every rank, which is what ZeRO-3 exists to avoid",
            detail=f"peak {peak} gathered buffers alive, limit {limit} (measured by the grader)",
        )
        if not over and not short:  # bytes below every Python name: the kernel's counters
            yield _prefetch_wire(answer, grader, problem, world_size)
