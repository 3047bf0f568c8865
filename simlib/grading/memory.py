"""Checks for lesson 07: the sharded optimizer (ZeRO-1). The ZeRO-3 Linear (gather, free, reduce-scatter) is in
:mod:`simlib.grading.zero3_linear`, the activation-checkpoint exercise in :mod:`simlib.grading.checkpointing`
(re-exported here: the exercise imports ``checkpoint_problem`` from this module)."""

from __future__ import annotations

from .core import Result, _close, exercise, max_error
from .weighing import _alive_after, _step_memory  # noqa: F401 - _step_memory: the accumulation test's

# ---- ZeRO-1: ShardedOptimizer(params, optimizer_cls, **kwargs) ----

# every AdamW hyper-parameter away from its default: an optimizer that forwards only lr to its inner one is wrong
_SO_HYPER = dict(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)
WORLD_SIZES = (2, 3, 4)  # 3: code right only for even splits or powers of two fails


def _sharded_optimizer_harness(
    answer_cls, steps, width, depth, global_batch, lr, seed, hyper=None, weigh=True, head_only=False
):
    """Every rank: the answer's parameters after ``steps`` steps and (``weigh``) its bytes; rank 0 weighs AdamW's.
    ``head_only``: the optimizer is given the output layer's two tensors only (the rest frozen), so on 3 or more
    ranks some rank owns nothing (an empty shard)."""
    import copy

    import torch
    import torch.distributed as dist

    from ..lessons.memory import mlp_problem

    rank, n = dist.get_rank(), dist.get_world_size()
    model, x, y = mlp_problem(width, depth, global_batch, seed)  # the grader's secret seed: the same on every rank
    if head_only:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    full_model = copy.deepcopy(model)  # the grader's own: AdamW over every parameter, weighed the same way
    hyper = dict(hyper or {})
    # smallest first: AdamW (one tensor at a time) keeps a tensor's denominator until the next one's replaces it,
    # so its scratch peaks at 2x one tensor + the one before; ascending order makes that the most any subset of
    # these parameters (any rank's shard, in any order) can need: the scratch an honest shard may allocate
    full_opt = torch.optim.AdamW(sorted(full_model.parameters(), key=lambda p: p.numel()), lr=lr, **hyper)
    weighed = _step_memory if weigh else (lambda fn: (fn(), (0, 0))[1])  # not weighed: (peak, kept) = (0, 0)
    box = {}
    given = [p for p in model.parameters() if p.requires_grad]
    build = weighed(lambda: box.update(opt=answer_cls(given, torch.optim.AdamW, lr=lr, **hyper)))
    opt = box["opt"]
    b = global_batch // n
    peaks, kept = [], build[1]
    full_peak = full_kept = full_scratch = None
    for step in range(steps):
        torch.nn.functional.mse_loss(model(x[rank * b : (rank + 1) * b]), y[rank * b : (rank + 1) * b]).backward()
        for p in given:  # data parallelism (what DDP does): average the gradients
            dist.all_reduce(p.grad)
            p.grad /= n
        peak, left = weighed(opt.step)  # what this rank holds WHILE it steps
        peaks.append(kept + peak)
        kept += left
        opt.zero_grad()
        if step == 0:  # what zero_grad left behind (a gradient not cleared piles up into the next step)
            left_grads = [k for k, p in model.named_parameters() if p.grad is not None and bool(p.grad.any())]
            if weigh and rank == 0:  # the check reads the whole-AdamW reference's bytes from rank 0 only
                for p, q in zip(full_model.parameters(), model.parameters()):
                    p.grad = torch.ones_like(q)
                full_peak, full_kept = _step_memory(full_opt.step, census=False)  # the first step builds the state
                full_scratch = _step_memory(full_opt.step, census=False)[0]  # a later one: AdamW's scratch alone
    return dict(
        params={k: v.detach().clone() for k, v in model.state_dict().items()},
        initial=initial,
        peak=max(peaks),
        kept=kept,
        full_peak=full_peak,
        full_kept=full_kept,
        full_scratch=full_scratch,
        left_grads=left_grads,
        numel=sum(p.numel() for p in model.parameters()),
    )


def _sharded_reference(steps, width, depth, global_batch, lr, seed, head_only=False, **hyper) -> dict:
    """One process, the whole batch, AdamW with ``hyper``: what the sharded optimizer must reproduce."""
    import torch

    from ..lessons.memory import mlp_problem

    model, x, y = mlp_problem(width, depth, global_batch, seed)
    if head_only:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, **hyper)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return dict(params={k: v.detach().clone() for k, v in model.state_dict().items()})


def _largest_share(so: dict, world_size: int) -> float:
    """The largest fraction of the drawn model's parameter elements one rank owns under the exercise's partition
    (largest tensor first, each to the least-loaded rank): an even split is not always possible."""
    from ..lessons.memory import mlp_problem

    model, _, _ = mlp_problem(so["width"], so["depth"], so["global_batch"], so["seed"])
    load = [0] * world_size
    for n in sorted((p.numel() for p in model.parameters()), reverse=True):
        load[min(range(world_size), key=lambda r: (load[r], r))] += n
    return max(load) / sum(load)


def so_problem():
    """A Hypothesis strategy of the sharded-optimizer problem: odd widths, 1 or 2 blocks, a secret seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            steps=st.just(3),
            width=st.integers(5, 15),
            depth=st.integers(1, 2),
            global_batch=st.sampled_from((12, 24)),
            lr=st.just(1e-2),
            seed=st.integers(0, 2**31 - 1),
        )
    )


_BUILT: dict = {}  # in a worker: the optimizer the metered run steps, built by the run before (not metered)


def _so_wire_harness(answer_cls, so: dict, metered: bool):
    """Not ``metered``: build the model (every rank computes the whole batch's gradients: nothing to average) and
    the answer's optimizer (or, ``answer_cls`` None, the course's owners: :func:`simlib.parallel.zero.partition`),
    kept in this worker; ``metered``: one step of it, for the kernel's counters (what a constructor sends, e.g. a
    first broadcast of the weights, is not judged). The course's step broadcasts each parameter from its owner and
    says the bytes that moves over all ranks (a broadcast of b bytes delivers b to each of the n - 1 others) and
    the most a right step may move: an all-gather of the owners' shares, padded to the largest."""
    import torch
    import torch.distributed as dist

    from ..lessons.memory import mlp_problem
    from ..parallel.zero import partition

    n = dist.get_world_size()
    if not metered:
        model, x, y = mlp_problem(so["width"], so["depth"], so["global_batch"], so["seed"])
        torch.nn.functional.mse_loss(model(x), y).backward()
        given = [p for p in model.parameters() if p.requires_grad]
        if answer_cls is None:
            _BUILT["step"] = (given, partition([p.numel() for p in given], n))
        else:
            opt = answer_cls(given, torch.optim.AdamW, lr=so["lr"], **_SO_HYPER)
            _BUILT["step"] = opt.step
        return {}
    built = _BUILT.pop("step")
    if callable(built):
        built()
        return {}
    given, owner = built
    with torch.no_grad():
        for p, r in zip(given, owner):
            dist.broadcast(p.data, src=r)
    sizes = [p.numel() * p.element_size() for p in given]
    load = [sum(b for b, o in zip(sizes, owner) if o == r) for r in range(n)]
    return dict(payload=(n - 1) * sum(sizes), most=(n - 1) * n * max(load))


def _so_wire(answer, grader, so: dict, world_size: int) -> Result:
    """Bytes sent over all ranks by one step of the answer on a wide copy of ``so`` (the kernel's counters),
    against the course's broadcasts from the owners on the same instance (:func:`simlib.grading.wire.beyond`)."""
    from .wire import beyond, per_rank

    wide = {**so, "width": 48 + so["width"], "depth": 2}  # the parameters, not the headers, fill the wire
    name = f"{world_size} ranks, width {wide['width']}: one step sends each parameter from its owner once"
    grader.run(world_size, _so_wire_harness, None, wide, False, what="the course's owners")
    refs = grader.run(world_size, _so_wire_harness, None, wide, True, what="the course's broadcasts", wire=True)
    reference = grader.wire_last
    grader.run(world_size, _so_wire_harness, answer, wide, False, what=f"your ShardedOptimizer on {world_size} ranks")
    grader.run(world_size, _so_wire_harness, answer, wide, True, what=f"your step on {world_size} ranks", wire=True)
    if reference is None or grader.wire_last is None:
        return Result(name + " (skipped: the kernel's counters cannot be read here)", True)
    payload, most = refs[0]["payload"], refs[0]["most"]
    total = sum(per_rank(reference, world_size))
    breach = beyond(
        [sum(per_rank(grader.wire_last, world_size))],
        [total + max(most - payload, 0)],
        [most],
        "each parameter from its owner to the other ranks (or an all-gather of the owners' shares, padded)",
    )
    return Result(
        name + " (the kernel's counters, all ranks together)",
        not breach,
        "after its step each owner sends its parameters to the other ranks once (a broadcast from the owner, or an "
        "all-gather of the shards): an all-reduce of the parameters moves twice that, and a broadcast of every "
        "parameter from every rank (or of the gradients too) more",
        breach,
    )


def _so_wrong(answer, grader, so: dict, world_size: int) -> bool:
    """One run of ``so`` (not weighed): do the ranks disagree, or differ from AdamW in one process?"""
    so = {k: so[k] for k in ("steps", "width", "depth", "global_batch", "lr", "seed")}
    outs = grader.run(world_size, _sharded_optimizer_harness, answer, *so.values(), None, False)
    want = _sharded_reference(**so)["params"]
    return not all(_close(o["params"][k], v, rtol=1e-5, atol=2e-6) for o in outs for k, v in want.items())


def _so_smallest(answer, grader, so: dict, world_size: int) -> str:
    """The smallest failing problem Hypothesis finds on ``world_size`` ranks (4 runs at most, only after a
    failure); nothing for the tests of planted answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if grader.first_failure:
        return ""

    def fails(p) -> bool:
        try:
            return _so_wrong(answer, grader, p, world_size)
        except _Stop:
            return True

    p = smallest(so_problem(), fails, budget=4, first=so)
    return f"; smallest failing case found: {world_size} ranks, width {p['width']}, depth {p['depth']}, batch {p['global_batch']}"


@exercise("sharded_optimizer")
def _check_sharded_optimizer(answer, grader):
    from .instances import draw

    so = draw(so_problem(), 1)[0]  # drawn now, from the OS's randomness
    so = {k: so[k] for k in ("steps", "width", "depth", "global_batch", "lr", "seed")}  # the harness's order
    ref, told = _sharded_reference(**so), []
    for world_size in WORLD_SIZES:
        outs = grader.run(world_size, _sharded_optimizer_harness, answer, *so.values())
        same = all(_close(o["params"][k], outs[0]["params"][k], rtol=0, atol=0) for o in outs for k in ref["params"])
        bad = [k for k in ref["params"] if not _close(outs[0]["params"][k], ref["params"][k], rtol=1e-5, atol=2e-6)]
        stale = [k for k in bad if _close(outs[0]["params"][k], outs[0]["initial"][k], rtol=0, atol=0)]
        differ = [
            (r, k)
            for r, o in enumerate(outs)
            for k in ref["params"]
            if not _close(o["params"][k], outs[0]["params"][k], rtol=0, atol=0)
        ]
        uncleared = [(r, o["left_grads"]) for r, o in enumerate(outs) if o["left_grads"]]
        if uncleared and (bad or not same):
            r, names = uncleared[0]
            hint = (
                f"after zero_grad(), rank {r} still holds the gradients of {len(names)} parameters "
                f"({', '.join(names[:3])}): they add up into the next step. zero_grad must clear every "
                "parameter's gradient (all of self.param_groups), not only the inner optimizer's"
            )
        elif not same:
            r, k = differ[0]
            hint = (
                f"the ranks' parameters differ ({len(differ)} tensors, first {k!r} on rank {r} against rank 0): "
                "after stepping its shard, each owner must send its updated parameters to every rank "
                "(dist.broadcast(p.data, src=owner) for each parameter)"
            )
        elif stale:
            hint = (
                f"{len(stale)} parameters never change on any rank ({', '.join(stale[:3])}): they were "
                f"broadcast from a rank that did not update them. The src of each broadcast is that "
                f"parameter's owner, not rank 0 - the same owner that stepped it, for any world size"
            )
        elif not bad:
            hint = ""
        else:
            worst_k = max(bad, key=lambda k: max_error(outs[0]["params"][k], ref["params"][k]))
            hint = (
                f"{len(bad)} parameters differ from AdamW on one process (worst {worst_k!r}), though every "
                "rank agrees and every parameter moved: look at what your step does beyond the inner "
                "optimizer's step (the kwargs you pass it, zero_grad, a second step)"
            )
        worst = max((max_error(outs[0]["params"][k], ref["params"][k]) for k in bad), default=0.0)
        if (bad or not same) and not told:  # the smallest problem Hypothesis finds that still fails (once)
            told.append(world_size)
            hint += _so_smallest(answer, grader, so, world_size)
        yield Result(
            f"{world_size} ranks: equal to AdamW in one process (atol 2e-6, rtol 1e-5)",
            not bad and same,
            hint,
            f"{len(bad)} tensors differ, max error {worst:.1e}" if bad else "",
        )
        full_kept, full_peak, full_scratch = outs[0]["full_kept"], outs[0]["full_peak"], outs[0]["full_scratch"]
        kept = [o["kept"] for o in outs]
        peaks = [o["peak"] for o in outs]
        # the largest share the exercise's own partition (largest tensor first, to the least-loaded rank) gives one
        # rank of the drawn model's parameters, with the same 1.5x slack as an even split (1.5 / world size)
        share = 1.5 * max(1 / world_size, _largest_share(so, world_size))
        held = max(kept) <= share * full_kept and sum(kept) <= 1.1 * full_kept
        yield Result(
            f"{world_size} ranks: each rank keeps optimizer state for its own shard only",
            held,
            "build the inner optimizer over the parameters this rank owns, not all of them, and keep no "
            "other per-parameter state of your own: that is the memory ZeRO-1 saves (each parameter's "
            "Adam state lives on exactly one rank). Every allocation is weighed, torch's (profiler) and "
            "NumPy's: state moved into NumPy arrays counts the same",
            f"bytes kept after the steps per rank {kept}; AdamW over every parameter keeps {full_kept}",
        )
        # while it steps a rank may hold its share of the state (the bound above) and the scratch AdamW itself
        # allocates for its tensors (measured on the whole model, smallest tensor first: the most any shard needs)
        allowed = share * full_kept + full_scratch
        during = max(peaks) <= allowed
        worst_rank = max(range(world_size), key=lambda r: peaks[r])
        yield Result(
            f"{world_size} ranks: no rank holds more than its shard while it steps (peak measured during step)",
            during,
            f"rank {worst_rank} held {peaks[worst_rank]:,} B at the peak of step(), "
            f"{peaks[worst_rank] / full_peak:.2f}x what AdamW over every parameter needs at its peak "
            f"({full_peak:,} B); its share of the state ({share * full_kept:,.0f} B) and AdamW's own "
            f"scratch ({full_scratch:,} B) allow {allowed:,.0f} B: something full-sized is allocated during "
            "step (a copy of every parameter or gradient, the whole state built and dropped)",
            f"peak per rank {peaks}; allowed {allowed:,.0f} (share of the state {share * full_kept:,.0f} + "
            f"AdamW's scratch {full_scratch:,})",
        )
        if not bad and same:  # bytes below every Python name: the kernel's counters
            yield _so_wire(answer, grader, so, world_size)
    # every hyper-parameter reaches the inner optimizer (family 4): an answer that forwards only lr steps with the
    # default betas, eps and weight decay, 8.5e-3 away after 3 steps (measured); summation order over 2-4 ranks
    # moved the solution by at most 7.7e-6
    # on 4 ranks with the output layer's 2 tensors only (the rest frozen): ranks 2 and 3 own nothing (issue 47:
    # ZeRO-1 with no empty-shard guard passed, as no rank ever owned nothing)
    from .core import _Stop

    try:
        outs = grader.run(4, _sharded_optimizer_harness, answer, *so.values(), _SO_HYPER, False, True)
    except _Stop as stop:
        if "empty parameter list" in (stop.result.detail + stop.result.hint):
            stop.result.hint = (
                "with fewer tensors than ranks (here 2 tensors on 4 ranks) some rank owns no "
                "parameter, and torch's optimizers refuse an empty list: build the inner "
                "optimizer only when this rank owns something (and skip its step otherwise)\n" + stop.result.hint
            )
        raise
    want = _sharded_reference(**so, head_only=True, **_SO_HYPER)["params"]
    off = max(max_error(outs[0]["params"][k], v) for k, v in want.items())
    yield Result(
        f"4 ranks, 2 tensors (ranks 2 and 3 own nothing), AdamW({', '.join(f'{k}={v}' for k, v in _SO_HYPER.items())}): "
        "every keyword reaches the inner optimizer",
        off <= 2e-5,
        ""
        if off <= 2e-5
        else "pass every keyword you were given (**kwargs: betas, eps, weight_decay, ...) "
        "to the inner optimizer, not only lr",
        f"max error {off:.1e}",
    )


# the activation-checkpoint exercise (registered when this module is imported, as lesson 07's other checks)
from .checkpointing import _best_cost, _best_set, checkpoint_problem, kept_activation_bytes  # noqa: E402,F401
