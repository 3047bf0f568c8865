"""Checks for lesson 01: the ring all-reduce, built from send/recv, on drawn cases."""

from __future__ import annotations

from .core import Result, _close, exercise, max_error
from .dp_common import only_some_sizes

# ---- lesson 01: ring all-reduce from send/recv ----

# Secret instances (simlib.grading.instances): per world size a few shapes drawn at check time: a length that does
# not divide, one shorter than the world, a 2-D tensor, float32 and float64 (a receive buffer of the default dtype
# is wrong for float64), and one large tensor (an answer that rings only small ones and calls all_reduce above a
# size fails). Values come from a seed drawn from the OS; the workers get only the plain case.
# 3 and 5 catch code right only for powers of two or a hard-coded world size; 5 gives other remainders (chunks of
# unequal length) than 3 (a fifth world costs a fraction of a second here: workers fork from a warm zygote)
_RING_WORLDS = (2, 3, 4, 5)
_RING_DTYPES = ("float32", "float64")


def ring_case(world_size: int, kind: str):
    """A Hypothesis strategy of one ring all-reduce case of ``kind`` on ``world_size`` ranks."""
    from hypothesis import strategies as st

    dtype = st.sampled_from(_RING_DTYPES)
    seed = st.integers(0, 2**62)
    if kind == "uneven":  # numel % world_size != 0 (a `//` drops the tail)
        numel = st.integers(world_size + 1, 12 * world_size).filter(lambda n: n % world_size)
        shape = numel.map(lambda n: (n,))
    elif kind == "short":  # fewer elements than ranks: some chunks are empty
        shape = st.integers(1, world_size - 1).map(lambda n: (n,)) if world_size > 2 else st.just((1,))
    elif kind == "matrix":  # any shape: work on a flat view
        shape = st.tuples(st.integers(2, 5), st.integers(2, 7))
    else:  # "large": thousands of elements, not a multiple of the world size
        shape = st.integers(3000, 6000).filter(lambda n: n % world_size).map(lambda n: (n,))
    return st.fixed_dictionaries(dict(shape=shape, dtype=dtype, seed=seed))


def _ring_cases() -> dict:
    """{world size: cases}, drawn now (one Hypothesis draw for all of them)."""
    from hypothesis import strategies as st

    from .instances import draw

    kinds = {w: ("uneven", "short", "matrix", "uneven") + (("large",) if w == 3 else ()) for w in _RING_WORLDS}
    strategy = st.tuples(*(st.tuples(*(ring_case(w, k) for k in kinds[w])) for w in _RING_WORLDS))
    drawn = draw(strategy, 1)[0]
    cases = {w: [dict(c) for c in drawn[i]] for i, w in enumerate(_RING_WORLDS)}
    for w in cases:  # both dtypes on every size
        cases[w][1]["dtype"] = "float64" if cases[w][0]["dtype"] == "float32" else "float32"
    return cases


def _ring_harness(answer, cases):
    import torch
    import torch.distributed as dist

    from .contracts import recorder

    rank = dist.get_rank()
    out = []
    for case in cases:
        shape = tuple(case["shape"])
        g = torch.Generator().manual_seed(case["seed"] + rank)
        x = torch.randn(*shape, generator=g, dtype=getattr(torch, case["dtype"]))
        given = x.clone()
        with recorder(keep=True) as rec:  # the grader's, at the dispatcher (simlib.grading.contracts)
            returned = answer(given)
        result = returned if isinstance(returned, torch.Tensor) else given
        out.append(
            dict(
                shape=shape,
                result=result.detach().clone(),
                expected=_ring_sum(case, dist.get_world_size()),
                in_place=torch.equal(given, result) if given.shape == result.shape else False,
                used=sorted(set(rec.collectives)),
                sent=rec.sent,
                calls=list(rec.calls),
                input=x,
                payloads=[(int(p), t) for p, t in rec.payloads if p is not None],
            )
        )
    return out


def _ring_sum(case, world_size):
    """The sum of every rank's input for ``case``, computed from the case itself (no collective: the run's traffic
    is the answer's alone)."""
    import torch

    dtype = getattr(torch, case["dtype"])
    return sum(
        torch.randn(*case["shape"], generator=torch.Generator().manual_seed(case["seed"] + r), dtype=dtype)
        for r in range(world_size)
    )


def _wire_breach(pairs: dict, cases, world_size: int) -> str:
    """The first way the bytes on the wire (the kernel's TCP counters, read by the grader: :mod:`.wire`) are not a
    ring's: data sent to a rank other than the next one, or less than the ring's payload to the next one."""
    import math

    import torch

    need = sum(
        2 * (world_size - 1) * (math.prod(c["shape"]) // world_size) * getattr(torch, c["dtype"]).itemsize
        for c in cases
    )
    for r in range(world_size):
        forward = pairs.get((r, (r + 1) % world_size), [0, 0])[0]
        for (src, dst), (sent, _) in sorted(pairs.items()):
            if src == r and dst != (r + 1) % world_size and world_size > 2 and sent > 0.05 * forward + 4096:
                return (
                    f"rank {r} sent {sent:,} bytes to rank {dst} on the wire, which is not its right neighbour "
                    f"({(r + 1) % world_size}); it sent {forward:,} to it"
                )
        if forward < need:
            return (
                f"rank {r} sent {forward:,} bytes on the wire to its right neighbour; a ring sends at least "
                f"{need:,} for these tensors"
            )
    return ""


def _ring_wrong(answer, grader, world_size, case) -> str:
    """What the answer gets wrong on ``case`` ("" where it is right)."""
    per_rank = [o[0] for o in grader.run(world_size, _ring_harness, answer, [case])]
    bad = [r for r, c in enumerate(per_rank) if not _close(c["result"], c["expected"])]
    if not bad:
        return ""
    worst = max(max_error(per_rank[r]["result"], per_rank[r]["expected"]) for r in bad)
    return f"max error {worst:.2g} on rank(s) {bad}"


def _ring_smallest(answer, grader, world_size, case) -> str:
    """The smallest failing case Hypothesis finds (shrinking) at this world size, for the hint."""
    from hypothesis import strategies as st

    from .instances import shrink

    strategy = st.one_of(*(ring_case(world_size, k) for k in ("short", "uneven", "matrix")))
    small, what = shrink(strategy, lambda c: _ring_wrong(answer, grader, world_size, c), case, grader)
    if not what or small is case:
        return ""
    return f" Smallest failing case found: {world_size} ranks, shape {tuple(small['shape'])}, {small['dtype']}: {what}."


def _ring_volume(shape, world_size) -> tuple[int, int]:
    """Elements all ranks together send in a ring all-reduce: exactly, and with chunks padded to equal length."""
    import math

    numel = math.prod(shape)
    steps = 2 * (world_size - 1)
    return steps * numel, steps * world_size * -(-numel // world_size)


def _ring_hint(cases_by_rank, world_size) -> str:
    from ..collectives import chunk_bounds

    case = cases_by_rank[0]
    got = [c["result"].reshape(-1) for c in cases_by_rank]
    want = case["expected"].reshape(-1)
    if got[0].numel() != want.numel():
        return f"the result has {got[0].numel()} elements, the input {want.numel()}: keep the tensor's size"
    if all(_close(g, want / world_size) for g in got):
        return "you returned the mean: all_reduce's default (ReduceOp.SUM) is the sum; do not divide"
    if _close(got[0], want) and not any(_close(g, want) for g in got[1:]):
        return (
            f"right on rank 0 only: ranks 1..{world_size - 1} do not end with the sum. Every rank must run both "
            "phases and the all-gather must pass the finished chunks all the way around the ring"
        )
    bounds = chunk_bounds(want.numel(), world_size)
    wrong = {
        r: [i for i, (s, e) in enumerate(bounds) if e > s and not _close(got[r][s:e], want[s:e])]
        for r in range(world_size)
    }
    numel = want.numel()
    tail = numel // world_size * world_size
    if 0 < tail < numel and all(_close(g[:tail], want[:tail]) for g in got):
        return (
            f"the last {numel - tail} element(s) are wrong: with {numel} elements on {world_size} ranks the "
            "chunks cannot all be numel // world_size long; cover every element (e.g. "
            "simlib.collectives.chunk_bounds or torch.tensor_split)"
        )
    if numel < world_size:  # some chunks are empty: a different bug from a dropped remainder
        return (
            f"with {numel} element(s) on {world_size} ranks some chunks are empty "
            f"({[e - s for s, e in bounds]} elements): every rank must still take part in each step, sending "
            "and receiving its (possibly empty) chunk, so that both sides of every send/recv agree"
        )
    if numel % world_size:
        sizes_hint = (
            f". With {numel} elements the chunks are uneven ({[e - s for s, e in bounds]}): both sides of a "
            "send/recv must agree on each chunk's length."
        )
    else:
        sizes_hint = ""
    own = [(r + 1) % world_size for r in range(world_size)]
    if all(own[r] not in wrong[r] for r in range(world_size)) and any(wrong.values()):
        return (
            "after the reduce-scatter phase each rank's own chunk is right, other chunks are not: check the "
            "all-gather phase (n-1 steps, each rank passes on the chunk it received in the step before)" + sizes_hint
        )
    if all(len(wrong[r]) == len(bounds) for r in range(world_size)):
        return (
            "every chunk is wrong. Reduce-scatter, step s: rank r sends chunk (r - s) % n to the right and adds "
            "the chunk it receives from the left into (r - s - 1) % n. All-gather, step s: it may only pass on "
            "finished chunks, starting with its own, (r + 1) % n: send (r + 1 - s) % n, receive (r - s) % n. "
            "Print the chunk indices per rank and step to compare" + sizes_hint
        )
    return (
        "some chunks are right and others not: check the chunk indices of both phases. Reduce-scatter, step s: "
        "send (r - s) % n, add the received one into (r - s - 1) % n. All-gather, step s: send (r + 1 - s) % n, "
        "copy the received one into (r - s) % n" + sizes_hint
    )


@exercise("ring_all_reduce")
def _check_ring(answer, grader):
    passed = []
    drawn = _ring_cases()  # drawn now, in this process, from the OS's randomness
    for world_size in _RING_WORLDS:
        cases = drawn[world_size]
        shapes = [tuple(c["shape"]) for c in cases]
        # on 3 ranks (with the large tensor), what crossed is also read from the kernel (on 2 ranks every rank is
        # the other's neighbour; one world size keeps the check's time)
        outs = grader.run(world_size, _ring_harness, answer, cases, wire=world_size == 3)
        on_wire = grader.wire_last  # what crossed between the ranks, read from the kernel by this process
        shrunk = False
        for i, shape in enumerate(shapes):
            per_rank = [outs[r][i] for r in range(world_size)]
            kind = (
                "any shape"
                if len(shape) > 1
                else (
                    "numel < world_size"
                    if shape[0] < world_size
                    else "numel not divisible by world_size"
                    if shape[0] % world_size
                    else "numel divisible by world_size"
                )
            )
            ok = all(_close(c["result"], c["expected"]) for c in per_rank)
            detail = "" if ok else "max error %.2g" % max(max_error(c["result"], c["expected"]) for c in per_rank)
            hint = "" if ok else _ring_hint(per_rank, world_size)
            if not ok and len(shape) > 1 and all(c["result"].shape != c["expected"].shape for c in per_rank):
                hint = "work on tensor.view(-1) (a view: writes land in the tensor) and return the tensor itself"
            if not ok:
                hint += only_some_sizes(passed, f"{world_size} ranks")
                if not shrunk and not grader.first_failure:  # once per world size: each run costs a call
                    shrunk = True
                    hint += _ring_smallest(answer, grader, world_size, cases[i])
            elif f"{world_size} ranks" not in passed:
                passed.append(f"{world_size} ranks")
            yield Result(
                f"{world_size} ranks, shape {shape} ({kind}, {cases[i]['dtype']}): equals dist.all_reduce",
                ok,
                hint,
                detail,
            )
        used = sorted({u for per in outs for c in per for u in c["used"]})
        yield Result(
            f"{world_size} ranks: built from send/recv only",
            not used,
            "the exercise is to build all-reduce from point-to-point messages: use dist.isend/irecv "
            "(or send/recv), not a collective (under any name)",
            f"ran the collective(s) {', '.join(used)}" if used else "",
        )
        volume = [
            (sum(outs[r][i]["sent"] for r in range(world_size)), _ring_volume(shape, world_size))
            for i, shape in enumerate(shapes)
        ]
        low = [(shape, sent, want) for shape, (sent, want) in zip(shapes, volume) if sent < want[0]]
        high = [(shape, sent, want) for shape, (sent, want) in zip(shapes, volume) if sent > want[1]]
        detail = "; ".join(
            f"shape {sh}: {sent} elements sent in all, a ring sends {want[0]}" for sh, sent, want in low + high
        )
        yield Result(
            f"{world_size} ranks: sends what a ring sends (2(n-1)/n of the tensor per rank)",
            not low and not high,
            "too little went through send/recv for the ranks to have shared their data: the values must "
            "travel as point-to-point messages, chunk by chunk around the ring"
            if low
            else "more data went through send/recv than a ring needs: each step sends one chunk (about numel/n "
            "elements) to the right neighbour, not the whole tensor",
            detail,
        )
        from .contracts import contract

        breaches = [
            b
            for r in range(world_size)
            for i, shape in enumerate(shapes)
            if (
                b := contract(
                    outs[r][i]["calls"],
                    r,
                    world_size,
                    neighbours=True,
                    max_sent=_ring_volume(shape, world_size)[1] // world_size,
                )
            )
        ]
        yield Result(
            f"{world_size} ranks: each rank talks to its ring neighbours only, sending its share",
            not breaches,
            "a ring all-reduce passes chunks to the next rank only: every rank sends "
            "2(n-1) chunks of about numel/n elements to one neighbour and receives as many from the other "
            "(a star through one rank, or a tree, moves the same total but not the ring's way)",
            breaches[0] if breaches else "",
        )
        from .contracts import ring_payload_breach

        carried = next(
            (
                b
                for i in range(len(shapes))
                for r in range(world_size)
                if (
                    b := ring_payload_breach(
                        [outs[q][i]["input"] for q in range(world_size)], outs[r][i]["payloads"], r
                    )
                )
            ),
            "",
        )
        yield Result(
            f"{world_size} ranks: the messages carry the ring's partial sums",
            not carried,
            "a ring all-reduce computes the sum IN its messages: in reduce-scatter step s a rank sends the "
            "sum of s + 1 ranks' chunk (its own added to what it received), in all-gather the finished "
            "chunks. Send your tensor's chunks (tensor.view(-1) split n ways) and add what arrives into "
            "them; a ring on zeros or copies, with the sum obtained another way, is not the algorithm",
            carried,
        )
        if on_wire is not None:
            breach = _wire_breach(on_wire, cases, world_size)
            yield Result(
                f"{world_size} ranks: on the wire (the kernel's TCP counters, outside your process), "
                "data flows to the next rank only",
                not breach,
                "what your ranks sent each other was counted by the operating system, below every Python "
                "name: a ring all-reduce sends each chunk to the next rank (rank r to r + 1), and nothing "
                "of the data to any other rank",
                breach,
            )
        in_place = all(c["in_place"] for per in outs for c in per)
        yield Result(
            f"{world_size} ranks: works in place and returns the tensor",
            in_place,
            "like dist.all_reduce, work in place: write the result into the tensor you were given (tensor.view(-1) and "
            "slices of it are views) and return it",
        )
