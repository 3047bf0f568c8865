"""Check for lesson 09's MoE dispatch and combine over all-to-all, on problems drawn at check time.

It runs on 2, 3 and 4 ranks against one process on the whole batch; when an answer is wrong the grader recomputes
the classic mistakes itself (experts placed round-robin, capacity ignored, gates left out) and names the one the
answer matches. What crossed between ranks is read from the kernel (:mod:`simlib.grading.wire`) on a wide copy of
each problem and compared with what the course's own expert-parallel layer
(:class:`~simlib.parallel.experts.ExpertParallelMoE`) sends on it: the tokens that leave each rank and their outputs
coming back, nothing more.
"""

from __future__ import annotations

import functools

from .core import Result, _close, exercise, max_error


def moe_problem(world_size: int):
    """A Hypothesis strategy of the MoE problem on ``world_size`` ranks: 2 or 3 experts per rank (placement shows),
    hidden size, tokens per rank and expert count all different (one dimension taken for another shows), a whole
    batch whose capacity (factor 1) differs from one rank's and from factor 1.25's, a secret seed."""
    from math import ceil

    from hypothesis import strategies as st

    def telling(m) -> bool:
        t, e, whole = m["tokens"], m["num_experts"], m["tokens"] * world_size
        return len({m["hidden"], e, t}) == 3 and ceil(t / e) != ceil(whole / e) != ceil(1.25 * whole / e)

    return st.fixed_dictionaries(
        dict(
            hidden=st.integers(3, 10),
            num_experts=st.integers(2, 3).map(lambda e: e * world_size),
            tokens=st.integers(4, 12),
            ffn=st.integers(4, 16),
            seed=st.integers(0, 2**62),
        )
    ).filter(telling)


def _moe_problems(worlds=(2, 3, 4)) -> dict:
    """{world size: problem}, drawn now from the OS's randomness; drawn again (6 times at most) while a classic
    mistake the grader recomputes would give the right output on some world size (e.g. no token over capacity)."""
    from hypothesis import strategies as st

    from .instances import draw

    shows = {"capacity_ignored": (1.0, True), "wrong_rank": (12.0, False), "gate_not_applied": (12.0, False)}
    for _ in range(6):  # each mistake in the case that shows it: tokens dropped, or room for every token
        drawn = dict(zip(worlds, draw(st.tuples(*(moe_problem(w) for w in worlds)), 1)[0]))
        if not any(  # the skewed case runs on the wide copy (_moe_wide)
            _near(_moe_reference(p, w, *c, m), _moe_reference(p, w, *c))
            for w, mp in drawn.items()
            for m, c in shows.items()
            for p in [_moe_wide(mp) if c[1] else mp]
        ):
            break
    return drawn


def _near(actual, expected, rtol=1e-6, atol=1e-8) -> bool:
    """``_close`` for two tensors of the grader's own (no message built when they differ: the redraw compares many)."""
    import torch

    return actual.shape == expected.shape and bool(torch.allclose(actual, expected, rtol=rtol, atol=atol))


def _moe_problem(mp: dict, world_size, skew):
    import torch

    from ..parallel.experts import MoE

    torch.manual_seed(mp["seed"])
    moe = MoE(mp["hidden"], mp["num_experts"], 1, 1.0, ffn=mp["ffn"]).double()
    g = torch.Generator().manual_seed(mp["seed"] + 10 * world_size)
    x = torch.randn(mp["tokens"] * world_size, mp["hidden"], generator=g, dtype=torch.float64)
    if skew:  # most tokens prefer expert 0, so its capacity overflows
        with torch.no_grad():
            moe.router.weight[0] += 3.0
            x += 0.5
    return moe, x


def _moe_harness(answer, mp, capacity_factor, skew):
    import torch
    import torch.distributed as dist

    from ..models import shard

    rank, n = dist.get_rank(), dist.get_world_size()
    moe, x = _moe_problem(mp, n, skew)
    local = mp["num_experts"] // n
    experts = torch.nn.ModuleList(moe.experts[rank * local : (rank + 1) * local])
    from .contracts import recorder

    with torch.no_grad(), recorder() as rec:  # the grader's record of every collective
        y = answer(shard(x, rank, n).clone(), moe.router, experts, mp["num_experts"], capacity_factor)
    return dict(y=y.detach().clone() if hasattr(y, "detach") else y, calls=rec.calls)


class _one_thread:
    """torch on one thread while the grader computes its references (a few dozen tiny matmuls): on a busy machine a
    second intra-op thread makes each one 20-50x slower (measured: 9-12 ms against 0.2-0.4 ms at load 20). The
    thread count is restored after."""

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)
        return False


@functools.lru_cache(maxsize=32)
def _routed(key: tuple, world_size: int, skew: bool):
    """One problem routed in one process, once: the layer, the whole batch, each token's gate, expert and place in
    its expert's queue. Read only (cached)."""
    import torch

    from ..parallel.experts import queue_positions, route

    mp = dict(key)
    with _one_thread(), torch.no_grad():
        moe, x = _moe_problem(mp, world_size, skew)
        _, gates, experts = route(moe.router(x), 1)
        pos, _ = queue_positions(experts, mp["num_experts"], distributed=False)
    return moe, x, gates[:, 0], experts[:, 0], pos[:, 0]


@functools.lru_cache(maxsize=128)
def _moe_output(key: tuple, world_size: int, capacity_factor: float, skew: bool, mistake):
    import torch

    from ..parallel.experts import capacity

    moe, x, gate, expert, pos = _routed(key, world_size, skew)
    e_count, tokens = dict(key)["num_experts"], x.shape[0]
    keep = pos < capacity(tokens, e_count, 1, capacity_factor)
    if mistake == "capacity_ignored":
        keep = torch.ones_like(keep)
    if mistake == "gate_not_applied":
        gate = torch.ones_like(gate)
    if mistake == "wrong_rank":  # sent to rank e % ep, run there by local expert e // ep
        local = e_count // world_size
        expert = (expert % world_size) * local + (expert // world_size) % local
    y = torch.zeros_like(x)
    with _one_thread(), torch.no_grad():
        for e in torch.unique(expert[keep]).tolist():  # each expert on the kept tokens it gets, nothing more
            rows = torch.nonzero(keep & (expert == e)).squeeze(1)
            y[rows] = moe.experts[e](x[rows]) * gate[rows].unsqueeze(1)
    return y


def _moe_reference(mp, world_size, capacity_factor, skew, mistake=None):
    """One process on the whole batch, top-1; ``mistake`` recomputes a classic wrong answer. Read only (cached)."""
    return _moe_output(tuple(sorted(mp.items())), world_size, float(capacity_factor), bool(skew), mistake)


_MOE_HINTS = {
    "wrong_rank": "tokens went to the wrong rank: experts are placed in blocks, so expert e lives on rank "
    "e // (E / ep) as its local expert e % (E / ep) — not on rank e % ep",
    "capacity_ignored": "the capacity was ignored: an expert takes at most capacity(tokens of the whole batch, E, 1, "
    "capacity_factor) tokens, in the order queue_positions gives; drop the others (their output "
    "is 0: only the residual carries them)",
    "gate_not_applied": "the combine must weigh each expert's output by its token's gate (the router probability of "
    "the chosen expert) before adding it at the token's position",
}


def _moe_check(answer, grader, mp, world_size, capacity_factor, skew, label, seen=None):
    """The answer's output on ``mp`` against one process's; ``seen`` (a dict): the run is also metered (what each
    rank sent, from the kernel's counters, into ``seen["wire"]``)."""
    import torch

    outs = grader.run(
        world_size,
        _moe_harness,
        answer,
        mp,
        capacity_factor,
        skew,
        what=f"your MoE layer on {world_size} ranks",
        wire=seen is not None,
    )
    if seen is not None:
        seen["wire"] = grader.wire_last
    from .contracts import contract

    want = _moe_reference(mp, world_size, capacity_factor, skew)
    label = f"{mp['num_experts']} experts, {mp['tokens']} tokens per rank, hidden {mp['hidden']}, {label}"
    try:
        got = torch.cat([torch.as_tensor(o["y"]) for o in outs])
    except Exception:  # noqa: BLE001
        got = None
    ok = got is not None and _close(got, want, rtol=1e-6, atol=1e-8)
    # the contract: tokens travel by all-to-all (dispatch and combine); other collectives carry counts at most
    breach = next(
        (
            b
            for r, o in enumerate(outs)
            for b in [
                contract(
                    o["calls"],
                    r,
                    world_size,
                    only={"all_to_all_single", "all_to_all"},
                    small=mp["num_experts"] * world_size,
                    at_least={"all_to_all_single|all_to_all": 2},
                )
            ]
            if b
        ),
        "",
    )
    if ok and breach:
        yield Result(
            f"{world_size} ranks, {label}: tokens dispatched and combined by all-to-all",
            False,
            "expert parallelism moves each token only to the rank of its expert and back: two all-to-alls "
            "(all_to_all_single with per-rank splits), not an all_gather of every token or a broadcast",
            breach,
        )
        return
    hint = ""
    if not ok:
        for mistake in ("wrong_rank", "capacity_ignored", "gate_not_applied"):
            if got is not None and _close(
                got, _moe_reference(mp, world_size, capacity_factor, skew, mistake), 1e-6, 1e-8
            ):
                hint = _MOE_HINTS[mistake]
                break
        else:
            hint = (
                "each rank's output must come back to its tokens' positions: send rows sorted by expert (hence by "
                "rank), exchange the counts first (all_to_all_single of E values), run each local expert on its "
                "rows, send the outputs back with the splits swapped, and add them at the tokens they came from"
            )
    if not ok:
        hint += _moe_smallest(answer, grader, mp, world_size, capacity_factor, skew)
    yield Result(
        f"{world_size} ranks, {label}: output equal to the one-process MoE on the whole batch",
        ok,
        hint,
        "" if ok or got is None else f"max error {max_error(got, want):.2g}",
    )


def _moe_wrong(answer, grader, mp, world_size, capacity_factor, skew) -> bool:
    import torch

    outs = grader.run(world_size, _moe_harness, answer, mp, capacity_factor, skew)
    try:
        got = torch.cat([torch.as_tensor(o["y"]) for o in outs])
    except Exception:  # noqa: BLE001 - wrong shapes: a wrong answer
        return True
    return not _close(got, _moe_reference(mp, world_size, capacity_factor, skew), rtol=1e-6, atol=1e-8)


def _moe_smallest(answer, grader, mp, world_size, capacity_factor, skew) -> str:
    """The smallest failing problem Hypothesis finds on ``world_size`` ranks (6 runs at most, only after a failure);
    nothing for the tests of planted answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if grader.first_failure:
        return ""

    def fails(p) -> bool:
        try:
            return _moe_wrong(answer, grader, p, world_size, capacity_factor, skew)
        except _Stop:
            return True

    p = smallest(moe_problem(world_size), fails, budget=6, first=mp)
    return (
        f"; smallest failing case found: {world_size} ranks, {p['num_experts']} experts, {p['tokens']} tokens per "
        f"rank, hidden {p['hidden']}, ffn {p['ffn']}"
    )


def _moe_wide(mp: dict) -> dict:
    """The problem made wide enough that its tokens, not the messages' headers, fill the wire (the skewed case
    runs on it, metered)."""
    return {**mp, "hidden": 384 + mp["hidden"]}


def _moe_wire_harness(mp, capacity_factor, skew):
    """The course's own expert-parallel layer (:class:`ExpertParallelMoE`) on ``mp`` once, for the kernel's
    counters; it also says the bytes of the rows this rank sends to other ranks (its kept tokens going out, the
    outputs of the tokens it received going back)."""
    import torch
    import torch.distributed as dist

    from ..models import shard
    from ..parallel.experts import ExpertParallelMoE

    rank, n = dist.get_rank(), dist.get_world_size()
    moe, x = _moe_problem(mp, n, skew)
    moe.capacity_factor = capacity_factor
    with torch.no_grad():
        _, _, stats = ExpertParallelMoE.from_dense(moe)(shard(x, rank, n).clone())
    rows = sum(c for j, c in enumerate(stats["sent_rows"]) if j != rank)
    rows += sum(c for j, c in enumerate(stats["received_rows"]) if j != rank)
    return dict(payload=rows * mp["hidden"] * x.element_size())


def _moe_wire(grader, wide, world_size, answer_pairs) -> Result:
    """What each rank sent in the answer's run on ``wide`` (skewed router, capacity factor 1: tokens dropped),
    against what the course's layer sends there (:func:`simlib.grading.wire.beyond`)."""
    from .wire import beyond, per_rank

    name = (
        f"{world_size} ranks, hidden {wide['hidden']}: on the wire only the tokens that leave each rank and their "
        "outputs"
    )
    if answer_pairs is not None:
        refs = grader.run(world_size, _moe_wire_harness, wide, 1.0, True, what="the course's MoE layer", wire=True)
    if answer_pairs is None or grader.wire_last is None:
        return Result(name + " (skipped: the kernel's counters cannot be read here)", True)
    breach = beyond(
        per_rank(answer_pairs, world_size),
        per_rank(grader.wire_last, world_size),
        [o["payload"] for o in refs],
        "the rows its kept tokens need (out to their experts' ranks, and back)",
    )
    return Result(
        name + " (the kernel's counters)",
        not breach,
        "expert parallelism sends each kept token once, to the rank of its expert, and its output back: drop the "
        "tokens over capacity BEFORE the dispatch (not after the combine), send each rank only the rows for its "
        "experts, and never gather, broadcast or all-reduce every token",
        breach,
    )


@exercise("moe_dispatch")
def _check_moe_dispatch(answer, grader):
    problems = _moe_problems()  # drawn now, in this process, from the OS's randomness
    for world_size in (2, 3, 4):
        mp, seen = problems[world_size], {}
        wide = _moe_wide(mp)  # tokens dropped, metered: wide enough for the tokens to fill the wire
        results = list(_moe_check(answer, grader, mp, world_size, 12.0, False, "room for every token"))
        results += list(
            _moe_check(answer, grader, wide, world_size, 1.0, True, "a skewed router, tokens dropped", seen)
        )
        if all(r.passed for r in results):  # bytes below every Python name: the kernel's counters
            results.append(_moe_wire(grader, wide, world_size, seen.get("wire")))
        yield from results
        if not all(r.passed for r in results):
            return
