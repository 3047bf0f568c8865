"""Checks for lessons 01-03: ring all-reduce, averaged gradients, bucketed data parallelism, accumulation."""
from __future__ import annotations

from .contracts import passes_breach, watch_passes
from .core import Result, _close, exercise, max_error

# ---- shared by lessons 01-03: a tiny regression problem and its single-process reference ----

_WORLD_SIZES = (2, 3, 4)  # 3 catches code right only for powers of two or a hard-coded world size


def dp_problem(frozen: bool = False, unused: bool = False):
    """A Hypothesis strategy of lessons 01-03's regression problem: odd widths, 1-3 hidden layers, a global batch
    that splits over 2, 3 and 4 ranks, a secret seed; ``frozen``: one parameter has requires_grad=False,
    ``unused``: one parameter takes no part in the forward (both leave p.grad None)."""
    from hypothesis import strategies as st
    return st.fixed_dictionaries(dict(
        width=st.integers(3, 19), depth=st.integers(1, 3), in_features=st.integers(2, 11),
        global_batch=st.sampled_from((12, 24, 36)), seed=st.integers(0, 2**62),
        frozen=st.integers(0, 3) if frozen else st.none(), unused=st.just(unused)))


def _draw_problem(**kw) -> dict:
    from .instances import draw
    return dict(draw(dp_problem(**kw), 1)[0])


def _tiny_problem(problem: dict):
    import torch

    from ..models import MLP, make_regression
    torch.manual_seed(problem["seed"] % 2**31)
    model = MLP(problem["width"], problem["depth"], in_features=problem["in_features"])
    params = list(model.parameters())
    if problem.get("frozen") is not None:
        params[problem["frozen"] % len(params)].requires_grad_(False)  # a frozen layer: its p.grad stays None
    if problem.get("unused"):
        model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))  # never in the forward: grad None
    x, y = make_regression(problem["global_batch"], problem["in_features"], seed=problem["seed"] % 2**31 + 1)
    return model, x, y


def _my_shard(x, y):
    import torch.distributed as dist

    from ..models import shard
    return shard(x, dist.get_rank(), dist.get_world_size()), shard(y, dist.get_rank(), dist.get_world_size())


def _reference(steps: int, lr: float, problem: dict):
    """Gradients of the first step and weights after ``steps`` SGD steps, one process, global batch."""
    import torch
    model, x, y = _tiny_problem(problem)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = None
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 0:
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    return dict(names=names, grads=grads, state=[p.detach().clone() for p in model.parameters()])


def _all_close(got, want, **tol) -> bool:
    return got is not None and len(got) == len(want) and all(
        (g is None and w is None) or (g is not None and w is not None and _close(g, w, **tol))
        for g, w in zip(got, want))


def _uniform_ratio(got, want):
    """c when every tensor of ``got`` is c times the one in ``want`` (one c for all), else None."""
    import torch
    pairs = [(g, w) for g, w in zip(got, want) if g is not None and w is not None]
    if not pairs:
        return None
    flat_got = torch.cat([g.reshape(-1).double() for g, _ in pairs])
    flat_want = torch.cat([w.reshape(-1).double() for _, w in pairs])
    c = float(flat_got @ flat_want / (flat_want @ flat_want)) if float(flat_want @ flat_want) else 0.0
    return c if c and abs(c - 1) > 1e-3 and _close(flat_got, c * flat_want) else None


def _problem_words(problem: dict) -> str:
    """The drawn instance, as a hint shows it."""
    words = (f" (the problem: an MLP of width {problem['width']}, {problem['depth']} hidden layer(s), "
             f"{problem['in_features']} inputs, global batch {problem['global_batch']}")
    if problem.get("frozen") is not None:
        words += ", one frozen parameter (requires_grad=False)"
    if problem.get("unused"):
        words += ", one parameter the forward never uses"
    return words + ")"


def only_some_sizes(passed: list, size_words: str) -> str:
    """A note for a check that passed on other sizes: the code holds only for some (hard-coded? powers of two?)."""
    if not passed:
        return ""
    return (f" It passed with {', '.join(passed)} but not with {size_words}: look for a number written into your "
            "code (a world size, k, an index) or arithmetic that holds only for powers of two, e.g. `x & (n - 1)` "
            "for `x % n`")


def _diagnose_grads(outs, ref, key="grads") -> tuple[bool, str, str]:
    """(passed, detail, hint) for per-rank gradient lists against the global-batch gradient."""
    world_size = len(outs)
    want = ref["grads"]
    bad_ranks = [r for r, out in enumerate(outs) if not _all_close(out[key], want)]
    if not bad_ranks:
        return True, "", ""
    got = outs[bad_ranks[0]][key]
    if got is None or any(g is None and w is not None for g, w in zip(got, want)):
        return False, "some gradients are None", "do not set p.grad to None; average it in place"
    if any(g is not None and w is None for g, w in zip(got, want)):
        return False, "a frozen or unused parameter got a gradient", (
            "a parameter with requires_grad=False, or one the forward never used, has p.grad None: leave it "
            "None (skip it: `if p.grad is not None`)")
    err = max(max_error(g, w) for g, w in zip(got, want) if g is not None and w is not None)
    detail = f"max error {err:.2g} on rank(s) {bad_ranks}"
    if _all_close(got, [None if w is None else w * world_size for w in want]):
        return False, detail, (f"your gradients are {world_size}x the right ones: all_reduce sums over the ranks, "
                               "so divide by world_size to get the mean")
    if _all_close(got, [None if w is None else w / world_size for w in want]):
        return False, detail, (f"your gradients are 1/{world_size} of the right ones: you divided by world_size "
                               "twice (all_reduce with SUM then one division gives the mean; ReduceOp.AVG needs "
                               "no division at all)")
    if bad_ranks == list(range(1, world_size)):
        return False, detail, ("right on rank 0 only: the other ranks do not end with the mean. Use "
                               "dist.all_reduce (every rank receives the sum), not dist.reduce(dst=0), and "
                               "divide on every rank, not only under `if rank == 0`")
    if "local" in outs[0] and _all_close(got, outs[bad_ranks[0]]["local"], rtol=0, atol=0):
        return False, detail, ("the gradients did not change: all_reduce works in place on the tensor you pass, "
                               "so pass p.grad itself (not a copy) and divide it in place")
    ratio = _uniform_ratio(got, want)
    if ratio is not None:
        return False, detail, (f"your gradients are {ratio:.3g}x the right ones on {world_size} ranks: divide the sum "
                               f"by exactly dist.get_world_size() (here {world_size}); a fixed number, or a power of "
                               "two, is right only for some world sizes")
    wrong = [ref["names"][i] for i, (g, w) in enumerate(zip(got, want)) if w is not None and not _close(g, w)]
    if len(wrong) < len(want):
        return False, detail, f"only some parameters are wrong: {', '.join(wrong)}. Average every parameter's gradient"
    return False, detail, ("compare with the recipe: dist.all_reduce(p.grad) (op SUM, in place) on every rank, "
                           "then p.grad /= world_size; skip a parameter whose p.grad is None (frozen or unused)")


def _spy_all_reduce(calls: list, flags: dict):
    """Wrap dist.all_reduce so each call is recorded; returns the function that undoes it."""
    import torch.distributed as dist
    original = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        calls.append(dict(flags, numel=tensor.numel(), async_op=bool(async_op)))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = spy

    def restore():
        dist.all_reduce = original
    return restore


# ---- lesson 01: ring all-reduce from send/recv ----

# Secret instances (simlib.grading.instances): per world size a few shapes drawn at check time: a length that does
# not divide, one shorter than the world, a 2-D tensor, float32 and float64 (a receive buffer of the default dtype
# is wrong for float64), and one large tensor (an answer that rings only small ones and calls all_reduce above a
# size fails). Values come from a seed drawn from the OS; the workers get only the plain case.
_RING_WORLDS = (2, 3, 4)  # 3 catches code right only for powers of two or a hard-coded world size
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
        expected = x.clone()
        dist.all_reduce(expected)
        given = x.clone()
        with recorder(keep=True) as rec:  # the grader's, at the dispatcher (simlib.grading.contracts)
            returned = answer(given)
        result = returned if isinstance(returned, torch.Tensor) else given
        out.append(dict(shape=shape, result=result.detach().clone(), expected=expected,
                        in_place=torch.equal(given, result) if given.shape == result.shape else False,
                        used=sorted(set(rec.collectives)), sent=rec.sent, calls=list(rec.calls), input=x,
                        payloads=[(int(p), t) for p, t in rec.payloads if p is not None]))
    return out


def _ring_wrong(answer, grader, world_size, case) -> bool:
    per_rank = [o[0] for o in grader.run(world_size, _ring_harness, answer, [case])]
    return not all(_close(c["result"], c["expected"]) for c in per_rank)


def _ring_smallest(answer, grader, world_size, case) -> str:
    """The smallest failing case Hypothesis finds (shrinking), for the hint."""
    from hypothesis import strategies as st

    from .core import _Stop
    from .instances import smallest

    def fails(c):
        try:
            return _ring_wrong(answer, grader, world_size, c)
        except _Stop:
            return True
    strategy = st.one_of(*(ring_case(world_size, k) for k in ("short", "uneven", "matrix")))
    small = smallest(strategy, fails, budget=6, first=case)
    return f" Smallest failing case found: {world_size} ranks, shape {tuple(small['shape'])}, {small['dtype']}."


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
        return (f"right on rank 0 only: ranks 1..{world_size - 1} do not end with the sum. Every rank must run both "
                "phases and the all-gather must pass the finished chunks all the way around the ring")
    bounds = chunk_bounds(want.numel(), world_size)
    wrong = {r: [i for i, (s, e) in enumerate(bounds) if e > s and not _close(got[r][s:e], want[s:e])]
             for r in range(world_size)}
    numel = want.numel()
    tail = numel // world_size * world_size
    if 0 < tail < numel and all(_close(g[:tail], want[:tail]) for g in got):
        return (f"the last {numel - tail} element(s) are wrong: with {numel} elements on {world_size} ranks the "
                "chunks cannot all be numel // world_size long; cover every element (e.g. "
                "simlib.collectives.chunk_bounds or torch.tensor_split)")
    if numel < world_size:  # some chunks are empty: a different bug from a dropped remainder
        return (f"with {numel} element(s) on {world_size} ranks some chunks are empty "
                f"({[e - s for s, e in bounds]} elements): every rank must still take part in each step, sending "
                "and receiving its (possibly empty) chunk, so that both sides of every send/recv agree")
    if numel % world_size:
        sizes_hint = (f". With {numel} elements the chunks are uneven ({[e - s for s, e in bounds]}): both sides of a "
                      "send/recv must agree on each chunk's length.")
    else:
        sizes_hint = ""
    own = [(r + 1) % world_size for r in range(world_size)]
    if all(own[r] not in wrong[r] for r in range(world_size)) and any(wrong.values()):
        return ("after the reduce-scatter phase each rank's own chunk is right, other chunks are not: check the "
                "all-gather phase (n-1 steps, each rank passes on the chunk it received in the step before)" + sizes_hint)
    if all(len(wrong[r]) == len(bounds) for r in range(world_size)):
        return ("every chunk is wrong. Reduce-scatter, step s: rank r sends chunk (r - s) % n to the right and adds "
                "the chunk it receives from the left into (r - s - 1) % n. All-gather, step s: it may only pass on "
                "finished chunks, starting with its own, (r + 1) % n: send (r + 1 - s) % n, receive (r - s) % n. "
                "Print the chunk indices per rank and step to compare" + sizes_hint)
    return ("some chunks are right and others not: check the chunk indices of both phases. Reduce-scatter, step s: "
            "send (r - s) % n, add the received one into (r - s - 1) % n. All-gather, step s: send (r + 1 - s) % n, "
            "copy the received one into (r - s) % n" + sizes_hint)


@exercise("ring_all_reduce")
def _check_ring(answer, grader):
    passed = []
    drawn = _ring_cases()  # drawn now, in this process, from the OS's randomness
    for world_size in _RING_WORLDS:
        cases = drawn[world_size]
        shapes = [tuple(c["shape"]) for c in cases]
        outs = grader.run(world_size, _ring_harness, answer, cases)
        shrunk = False
        for i, shape in enumerate(shapes):
            per_rank = [outs[r][i] for r in range(world_size)]
            kind = "any shape" if len(shape) > 1 else (
                "numel < world_size" if shape[0] < world_size else
                "numel not divisible by world_size" if shape[0] % world_size else "numel divisible by world_size")
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
            yield Result(f"{world_size} ranks, shape {shape} ({kind}, {cases[i]['dtype']}): equals dist.all_reduce",
                         ok, hint, detail)
        used = sorted({u for per in outs for c in per for u in c["used"]})
        yield Result(f"{world_size} ranks: built from send/recv only", not used,
                     "the exercise is to build all-reduce from point-to-point messages: use dist.isend/irecv "
                     "(or send/recv), not a collective (under any name)",
                     f"ran the collective(s) {', '.join(used)}" if used else "")
        volume = [(sum(outs[r][i]["sent"] for r in range(world_size)), _ring_volume(shape, world_size))
                  for i, shape in enumerate(shapes)]
        low = [(shape, sent, want) for shape, (sent, want) in zip(shapes, volume) if sent < want[0]]
        high = [(shape, sent, want) for shape, (sent, want) in zip(shapes, volume) if sent > want[1]]
        detail = "; ".join(f"shape {sh}: {sent} elements sent in all, a ring sends {want[0]}" for sh, sent, want
                           in low + high)
        yield Result(f"{world_size} ranks: sends what a ring sends (2(n-1)/n of the tensor per rank)",
                     not low and not high,
                     "too little went through send/recv for the ranks to have shared their data: the values must "
                     "travel as point-to-point messages, chunk by chunk around the ring" if low else
                     "more data went through send/recv than a ring needs: each step sends one chunk (about numel/n "
                     "elements) to the right neighbour, not the whole tensor", detail)
        from .contracts import contract
        breaches = [b for r in range(world_size) for i, shape in enumerate(shapes)
                    if (b := contract(outs[r][i]["calls"], r, world_size, neighbours=True,
                                      max_sent=_ring_volume(shape, world_size)[1] // world_size))]
        yield Result(f"{world_size} ranks: each rank talks to its ring neighbours only, sending its share",
                     not breaches, "a ring all-reduce passes chunks to the next rank only: every rank sends "
                     "2(n-1) chunks of about numel/n elements to one neighbour and receives as many from the other "
                     "(a star through one rank, or a tree, moves the same total but not the ring's way)",
                     breaches[0] if breaches else "")
        from .contracts import ring_payload_breach
        carried = next((b for i in range(len(shapes)) for r in range(world_size) if (b := ring_payload_breach(
            [outs[q][i]["input"] for q in range(world_size)], outs[r][i]["payloads"], r))), "")
        yield Result(f"{world_size} ranks: the messages carry the ring's partial sums", not carried,
                     "a ring all-reduce computes the sum IN its messages: in reduce-scatter step s a rank sends the "
                     "sum of s + 1 ranks' chunk (its own added to what it received), in all-gather the finished "
                     "chunks. Send your tensor's chunks (tensor.view(-1) split n ways) and add what arrives into "
                     "them; a ring on zeros or copies, with the sum obtained another way, is not the algorithm",
                     carried)
        in_place = all(c["in_place"] for per in outs for c in per)
        yield Result(f"{world_size} ranks: works in place and returns the tensor", in_place,
                     "like dist.all_reduce, work in place: write the result into the tensor you were given (tensor.view(-1) and "
                     "slices of it are views) and return it")


# ---- lesson 02: average gradients (naive data parallelism) ----

_DP_STEPS, _DP_LR = 2, 0.1


def _average_gradients_harness(answer, steps, lr, problem):
    import torch
    import torch.distributed as dist
    model, x, y = _tiny_problem(problem)
    xs, ys = _my_shard(x, y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = local = None
    moved = 0.0
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        if step == 0:
            local = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        from .contracts import recorder, traffic
        with recorder() as rec:  # the grader's: every collective and message, whatever name the answer used
            answer(model)
        moved = max(moved, traffic(rec.calls, dist.get_world_size()))
        if step == 0:
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
    with_grad = [p for p in model.parameters() if p.grad is not None]
    return dict(local=local, grads=grads, state=[p.detach().clone() for p in model.parameters()], moved=moved,
                numel=sum(p.numel() for p in with_grad), tensors=len(with_grad))


def _check_training(outs, ref, world_size, steps, extra_hint=""):
    ok = all(_all_close(out["state"], ref["state"]) for out in outs)
    same = all(_all_close(out["state"], outs[0]["state"], rtol=0, atol=0) for out in outs)
    detail = "" if ok else "max error %.2g" % max(max_error(a, b) for out in outs
                                                  for a, b in zip(out["state"], ref["state"]))
    rank0_only = not ok and _all_close(outs[0]["state"], ref["state"]) and not any(
        _all_close(out["state"], ref["state"]) for out in outs[1:])
    hint = ("right on rank 0 only: the other ranks' weights differ from the single-process run, so their gradients "
            "were not averaged (a reduce to rank 0 instead of an all-reduce? a step under `if rank == 0`?)"
            if rank0_only else "the ranks' weights differ from each other: the replicas drifted apart, so some "
            "gradients were not averaged across ranks" if not same else "the replicas agree with each other but "
            "not with the single-process run on the global batch") + extra_hint
    return Result(f"{world_size} ranks: weights after {steps} steps equal the "
                  "single-process run on the global batch", ok, hint, detail)


@exercise("average_gradients")
def _check_average_gradients(answer, grader):
    # drawn now from the OS's randomness; a frozen parameter (requires_grad=False) and one the forward never uses
    # on every size: their p.grad is None (the missing `if p.grad is not None` guard)
    from hypothesis import strategies as st

    from .instances import draw
    problems = dict(zip(_WORLD_SIZES, draw(st.tuples(*(dp_problem(True, True) for _ in _WORLD_SIZES)), 1)[0]))
    passed = []
    for world_size in _WORLD_SIZES:
        problem = problems[world_size]
        ref = _reference(_DP_STEPS, _DP_LR, problem)
        outs = grader.run(world_size, _average_gradients_harness, answer, _DP_STEPS, _DP_LR, problem)
        ok, detail, hint = _diagnose_grads(outs, ref)
        hint += "" if ok else only_some_sizes(passed, f"{world_size} ranks") + _problem_words(problem)
        passed += [f"{world_size} ranks"] if ok else []
        yield Result(f"{world_size} ranks: gradients equal the global-batch gradient", ok, hint, detail)
        yield _check_training(outs, ref, world_size, _DP_STEPS)
        # the contract: one all-reduce's volume per step, 2(n-1)/n of the gradients per rank (+ uneven ring chunks)
        n, worst = world_size, max(outs, key=lambda o: o["moved"])
        bound = 2 * (n - 1) / n * worst["numel"] + 2 * (n - 1) * worst["tensors"]
        yield Result(f"{world_size} ranks: moves no more than one all-reduce of the gradients", worst["moved"] <= bound,
                     "averaging gradients is one all-reduce: each rank puts 2(n-1)/n of the gradients on the wire "
                     "(nccl-tests' bus factor). Gathering every rank's whole gradient (all_gather, then the mean) "
                     "moves (n-1)x the gradients per rank, and a reduce to one rank then a broadcast twice the "
                     "gradients: call dist.all_reduce(p.grad) and divide by the world size",
                     f"a rank moved {worst['moved']:,.0f} elements in one step; one all-reduce of its "
                     f"{worst['numel']:,} gradient elements moves {2 * (n - 1) / n * worst['numel']:,.0f}")


# ---- lesson 02: bucketed data parallelism with gradient hooks ----



def _bucket_cap(problem: dict) -> float:
    """A bucket cap (MB) drawn now for the drawn problem: between its largest parameter and twice that, lowered
    until the parameters fall into at least three buckets (so a bucket has later layers to overlap with)."""
    from ..parallel.data import make_buckets
    from .instances import entropy
    model, _, _ = _tiny_problem(problem)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    cap = largest * (1 + entropy().random())
    while len(make_buckets(model.parameters(), cap / 2**20)) < 3 and cap > largest:
        cap = max(largest, cap * 0.8)
    return cap / 2**20


def _bucket_harness(answer_cls, steps, lr, bucket_cap_mb, problem, late):
    """The answer's bucketed DDP on the drawn problem, with the timeline the overlap check reads.

    Every all-reduce is recorded at torch's dispatcher (any name or alias), with the time it was issued, and the
    grader's own hooks note when each gradient is ready. In the first step every rank but 0 is ``late`` seconds
    late into its backward (a slow peer, made by the grader): rank 0's first bucket cannot finish before then, so
    if rank 0's backward goes on meanwhile (the next gradients ready within a fraction of ``late``), the
    communication overlapped the backward of later layers; if it waited on the all-reduce right away, the next
    gradient comes ``late`` seconds after. An extra async all-reduce of something else changes nothing here."""
    import time

    import torch
    import torch.distributed as dist

    from ..parallel.data import make_buckets
    from .contracts import recorder
    model, x, y = _tiny_problem(problem)
    xs, ys = _my_shard(x, y)
    rank = dist.get_rank()
    expected_buckets = len(make_buckets(model.parameters(), bucket_cap_mb))
    state = dict(step=-1, backward=False, slept=False)
    ready, issued = [], []  # (step, time) of each gradient ready, and (step, time, elements, during backward)

    def on_ready(param):  # registered before the answer's hooks: runs first
        if state["step"] == 0 and rank != 0 and not state["slept"]:
            state["slept"] = True
            time.sleep(late)  # this peer is late: rank 0's first all-reduce waits for it
        ready.append((state["step"], time.perf_counter()))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(on_ready)

    def watch(name, args):
        if name.startswith("c10d.allreduce"):
            from .contracts import _elements
            issued.append((state["step"], time.perf_counter(), _elements(args), state["backward"]))

    dp = answer_cls(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = None
    with recorder(watch=watch):  # the grader's, at the dispatcher: an alias or distributed_c10d is counted
        for step in range(steps):
            state.update(step=step)
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.mse_loss(dp(xs), ys)
            state.update(backward=True)
            loss.backward()
            state.update(backward=False)
            dp.finish_gradient_synchronization()
            if step == 0:
                grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
    calls = [dict(step=st, during_backward=bw, elements=e) for st, _, e, bw in issued if st >= 0]
    first = [t for st, t, _, bw in issued if st == 0 and bw]
    later = [t for st, t in ready if st == 0 and first and t > first[0]]
    gap = (later[0] - first[0]) if later else None  # from the first all-reduce to the next gradient, step 0
    return dict(grads=grads, state=[p.detach().clone() for p in model.parameters()], calls=calls,
                expected_buckets=expected_buckets, num_params=len(list(model.parameters())), gap=gap)


@exercise("bucket_data_parallel")
def _check_bucket(answer, grader):
    problem = _draw_problem()  # drawn now, from the OS's randomness
    problem["depth"] = max(problem["depth"], 2)  # at least 6 parameters: several buckets under the tiny cap
    ref = _reference(_DP_STEPS, _DP_LR, problem)
    cap_mb = _bucket_cap(problem)
    from .busy import Load
    outs_late = 0.25 * Load.now().factor  # the slow peer's delay: well above a layer's backward, even when busy
    passed = []
    for world_size in _WORLD_SIZES:
        outs = grader.run(world_size, _bucket_harness, answer, _DP_STEPS, _DP_LR, cap_mb, problem,
                          outs_late)
        ok, detail, hint = _diagnose_grads(outs, ref)
        hint += "" if ok else only_some_sizes(passed, f"{world_size} ranks")
        passed += [f"{world_size} ranks"] if ok else []
        yield Result(f"{world_size} ranks: gradients after finish_gradient_synchronization equal the global-batch "
                     "gradient", ok, hint, detail)
        yield _check_training(outs, ref, world_size, _DP_STEPS, extra_hint=(
            ". If the first step is right and the second is not: reset the pending counts and handles at the end "
            "of finish_gradient_synchronization, ready for the next backward"))
    out = outs[0]
    per_step = [sum(1 for c in out["calls"] if c["step"] == s) for s in range(_DP_STEPS)]
    want = out["expected_buckets"]
    hint = (f"{per_step[0]} all-reduces for {out['num_params']} parameters: you sent each gradient on its own. Copy "
            "it into its bucket's buffer and start one all-reduce when the bucket's last gradient has arrived"
            if per_step[0] == out["num_params"] else
            f"expected one all-reduce per bucket ({want}) in every step; the later steps show {per_step[1:]}: reset "
            "the per-bucket state after each step" if per_step[0] == want else
            f"expected one all-reduce per bucket ({want} buckets)")
    yield Result("one all_reduce per bucket per step", all(n == want for n in per_step), hint,
                 f"all_reduce calls per step: {per_step}, buckets: {want}")
    calls = out["calls"]
    gap, late = out["gap"], outs_late
    overlapped = bool(calls) and all(c["during_backward"] for c in calls) and gap is not None and gap < late / 2
    if not calls:
        hint = "no all_reduce was called at all"
    elif not all(c["during_backward"] for c in calls):
        hint = ("the all-reduces started after backward had finished: start each bucket's all_reduce from the "
                "gradient hook, as soon as the bucket is full, so it overlaps the rest of backward")
    else:
        hint = ("the backward stopped until the first bucket's all-reduce was through: pass async_op=True, keep "
                "the handle and wait on it only in finish_gradient_synchronization (a blocking all_reduce in the "
                "hook, or handle.wait() right after it, stalls backward, so nothing overlaps)")
    detail = (f"another rank was made {late:.2f} s late; on rank 0 the next gradient came "
              f"{gap:.2f} s after the first bucket's all-reduce started" if gap is not None else "")
    yield Result("the first bucket's all-reduce overlaps the backward of later layers (timeline)", overlapped, hint,
                 detail)


# ---- lesson 03: gradient accumulation with no_sync ----

_ACC_STEPS, _ACC_LR = 2, 0.1


def _acc_cases(problem: dict) -> list:
    """(world size, k) for 2, 3 and 4 ranks: k drawn now among the divisors of each rank's rows (2 or more, so
    micro-batches exist), preferring a k unequal to the micro-batch's own size (a loss divided by len(x) where it
    should be divided by k passes when they happen to be equal)."""
    from .instances import entropy
    rng, cases = entropy(), []
    for world_size in _WORLD_SIZES:
        rows = problem["global_batch"] // world_size
        ks = [k for k in range(2, rows + 1) if rows % k == 0]
        unequal = [k for k in ks if rows // k != k] or ks
        cases.append((world_size, rng.choice(unequal)))
    return cases


def _accumulation_harness(answer, k, steps, lr, problem):
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..lessons.data_parallel import count_all_reduces
    from ..parallel.accumulate import split_micro_batches
    model, x, y = _tiny_problem(problem)
    probe = DDP(copy.deepcopy(model))  # how many all-reduces one synced backward makes (DDP's buckets)
    probe_count = count_all_reduces(probe)
    probe(x[:2]).sum().backward()
    passes = watch_passes(model)  # the grader's hooks, on the model itself: DDP (or model.module) reaches them
    ddp = DDP(model)
    counter = count_all_reduces(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    micro_batches = split_micro_batches(*_my_shard(x, y), k)
    per_step = []
    for _ in range(steps):
        passes.update(forwards=[], backwards=0, overlapped=0)
        answer(ddp, opt, micro_batches, torch.nn.functional.mse_loss)
        per_step.append(dict(forwards=list(passes["forwards"]), backwards=passes["backwards"],
                             overlapped=passes["overlapped"]))
    return dict(state=[p.detach().clone() for p in model.parameters()], calls=counter["calls"],
                per_sync=probe_count["calls"], passes=per_step, micro_rows=max(len(mx) for mx, _ in micro_batches))


@exercise("accumulate_no_sync")
def _check_accumulation(answer, grader):
    problem = _draw_problem(frozen=True)  # drawn now; a frozen parameter (DDP leaves it out of its buckets)
    ref = _reference(_ACC_STEPS, _ACC_LR, problem)
    comm, passed = [], []
    for world_size, k in _acc_cases(problem):
        unscaled = _reference(_ACC_STEPS, _ACC_LR * k, problem)  # loss not divided by k: k times the step
        outs = grader.run(world_size, _accumulation_harness, answer, k, _ACC_STEPS, _ACC_LR, problem)
        result = _check_training(outs, ref, world_size, _ACC_STEPS)
        result.name = result.name.replace(f"{world_size} ranks:", f"{world_size} ranks, k = {k} micro-batches:")
        drifted = not all(_all_close(o["state"], outs[0]["state"], rtol=0, atol=0) for o in outs)
        if result.passed:
            pass
        elif all(_all_close(o["state"], unscaled["state"]) for o in outs):
            result.hint = (f"your update is {k}x too large: the {k} micro-batch gradients add up, so "
                           f"divide each micro-batch's loss by k = {k} (a mean of means)")
        elif drifted:
            result.hint += (". Is the last micro-batch's backward outside no_sync()? Only that backward "
                            "all-reduces the accumulated gradients. And is there one optimizer.step() after the "
                            "loop? A step inside it uses gradients no rank has shared yet")
        else:
            result.hint += (f". Check: one optimizer.step() and one optimizer.zero_grad() per call, after the loop "
                            f"over the micro-batches, and each loss divided by k = len(micro_batches) (here {k}; "
                            "other checks use other k: do not hard-code it)")
        if not result.passed:
            result.hint += only_some_sizes(passed, f"k = {k} on {world_size} ranks")
        else:
            passed.append(f"k = {k} on {world_size} ranks")
        yield result
        yield Result(f"{world_size} ranks, k = {k}: the replicas stay identical", not drifted,
                     "the ranks' weights differ: some optimizer step used gradients that were not all-reduced "
                     "(the last backward inside no_sync(), or a step inside the loop)")
        breach = passes_breach(outs, k)
        yield Result(f"{world_size} ranks, k = {k}: {k} micro-batch forwards and backwards per step, one at a time",
                     not breach,
                     f"accumulation is the algorithm: run forward and backward on each of the {k} micro-batches in "
                     "turn, so only one micro-batch's activations are alive at a time. One forward of the whole "
                     f"batch (torch.cat of the micro-batches), or one backward of the summed losses, gives the same "
                     f"gradients with {k}x the activation memory", breach)
        comm.append((world_size, k, outs[0]["calls"], _ACC_STEPS * outs[0]["per_sync"]))
    bad = [(w, k, calls, want) for w, k, calls, want in comm if calls != want]
    if not bad:
        hint = ""
    elif all(calls == k * want for _, k, calls, want in bad):
        hint = "you all-reduced on every micro-batch: run backward inside ddp.no_sync() for all but the last one"
    elif all(calls == 0 for _, _, calls, _ in bad):
        hint = "no all-reduce at all: the last micro-batch's backward must run outside no_sync()"
    else:
        hint = ("expected one synced backward per optimizer step: no_sync() on every micro-batch but the last, "
                "i == len(micro_batches) - 1 (do not hard-code k)")
    yield Result("communicates once per optimizer step (no_sync on all micro-batches but the last)", not bad, hint,
                 "; ".join(f"{w} ranks, k = {k}: {calls} all-reduce calls in {_ACC_STEPS} steps, expected {want}"
                           for w, k, calls, want in bad))
