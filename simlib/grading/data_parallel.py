"""Checks for lessons 01-03: ring all-reduce, averaged gradients, bucketed data parallelism, accumulation."""
from __future__ import annotations

from .contracts import passes_breach, watch_passes
from .core import Result, _close, exercise, max_error

# ---- shared by lessons 01-03: a tiny regression problem and its single-process reference ----

_PROBLEM = dict(width=16, depth=2, in_features=8, global_batch=24, seed=0)  # 24: splits over 2, 3 and 4 ranks
_WORLD_SIZES = (2, 3, 4)  # 3 catches code right only for powers of two or a hard-coded world size


def _tiny_problem():
    import torch

    from ..models import MLP, make_regression
    torch.manual_seed(_PROBLEM["seed"])
    model = MLP(_PROBLEM["width"], _PROBLEM["depth"], in_features=_PROBLEM["in_features"])
    x, y = make_regression(_PROBLEM["global_batch"], _PROBLEM["in_features"], seed=_PROBLEM["seed"] + 1)
    return model, x, y


def _my_shard(x, y):
    import torch.distributed as dist

    from ..models import shard
    return shard(x, dist.get_rank(), dist.get_world_size()), shard(y, dist.get_rank(), dist.get_world_size())


def _reference(steps: int, lr: float):
    """Gradients of the first step and weights after ``steps`` SGD steps, one process, global batch."""
    import torch
    model, x, y = _tiny_problem()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = None
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 0:
            grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    return dict(names=names, grads=grads, state=[p.detach().clone() for p in model.parameters()])


def _all_close(got, want, **tol) -> bool:
    return got is not None and len(got) == len(want) and all(
        g is not None and _close(g, w, **tol) for g, w in zip(got, want))


def _uniform_ratio(got, want):
    """c when every tensor of ``got`` is c times the one in ``want`` (one c for all), else None."""
    import torch
    flat_got = torch.cat([g.reshape(-1).double() for g in got])
    flat_want = torch.cat([w.reshape(-1).double() for w in want])
    c = float(flat_got @ flat_want / (flat_want @ flat_want)) if float(flat_want @ flat_want) else 0.0
    return c if c and abs(c - 1) > 1e-3 and _close(flat_got, c * flat_want) else None


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
    if got is None or any(g is None for g in got):
        return False, "some gradients are None", "do not set p.grad to None; average it in place"
    err = max(max_error(g, w) for g, w in zip(got, want))
    detail = f"max error {err:.2g} on rank(s) {bad_ranks}"
    if _all_close(got, [w * world_size for w in want]):
        return False, detail, (f"your gradients are {world_size}x the right ones: all_reduce sums over the ranks, "
                               "so divide by world_size to get the mean")
    if _all_close(got, [w / world_size for w in want]):
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
    wrong = [ref["names"][i] for i, (g, w) in enumerate(zip(got, want)) if not _close(g, w)]
    if len(wrong) < len(want):
        return False, detail, f"only some parameters are wrong: {', '.join(wrong)}. Average every parameter's gradient"
    return False, detail, ("compare with the recipe: dist.all_reduce(p.grad) (op SUM, in place) on every rank, "
                           "then p.grad /= world_size")


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

# world sizes 2, 3 and 4 (not only powers of two), lengths that do and do not divide, fewer elements than ranks;
# every second case in float64
# and one large tensor (an answer that rings only small ones and calls all_reduce above a size fails)
_RING_CASES = {2: [(8,), (7,)], 3: [(9,), (10,), (2,), (5003,)], 4: [(16,), (10,), (3,), (3, 4)]}


def _ring_harness(answer, shapes):
    import torch
    import torch.distributed as dist

    from .contracts import recorder
    rank = dist.get_rank()
    out = []
    for i, shape in enumerate(shapes):
        g = torch.Generator().manual_seed(100 * i + rank)
        # float32 and float64 in turn: a receive buffer of the default dtype is wrong for a float64 tensor
        x = torch.randn(*shape, generator=g, dtype=torch.float64 if i % 2 else torch.float32)
        expected = x.clone()
        dist.all_reduce(expected)
        given = x.clone()
        with recorder(keep=True) as rec:  # the grader's, at the dispatcher (simlib.grading.contracts)
            returned = answer(given)
        result = returned if isinstance(returned, torch.Tensor) else given
        out.append(dict(shape=tuple(shape), result=result.detach().clone(), expected=expected,
                        in_place=torch.equal(given, result) if given.shape == result.shape else False,
                        used=sorted(set(rec.collectives)), sent=rec.sent, calls=list(rec.calls), input=x,
                        payloads=[(int(p), t) for p, t in rec.payloads if p is not None]))
    return out


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
    for world_size, shapes in _RING_CASES.items():
        outs = grader.run(world_size, _ring_harness, answer, shapes)
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
            elif f"{world_size} ranks" not in passed:
                passed.append(f"{world_size} ranks")
            yield Result(f"{world_size} ranks, shape {shape} ({kind}): equals dist.all_reduce", ok, hint, detail)
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


def _average_gradients_harness(answer, steps, lr):
    import torch
    import torch.distributed as dist
    model, x, y = _tiny_problem()
    xs, ys = _my_shard(x, y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = local = None
    moved = 0.0
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        if step == 0:
            local = [p.grad.clone() for p in model.parameters()]
        from .contracts import recorder, traffic
        with recorder() as rec:  # the grader's: every collective and message, whatever name the answer used
            answer(model)
        moved = max(moved, traffic(rec.calls, dist.get_world_size()))
        if step == 0:
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
    return dict(local=local, grads=grads, state=[p.detach().clone() for p in model.parameters()], moved=moved,
                numel=sum(p.numel() for p in model.parameters()), tensors=len(list(model.parameters())))


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
    ref = _reference(_DP_STEPS, _DP_LR)
    passed = []
    for world_size in _WORLD_SIZES:
        outs = grader.run(world_size, _average_gradients_harness, answer, _DP_STEPS, _DP_LR)
        ok, detail, hint = _diagnose_grads(outs, ref)
        hint += "" if ok else only_some_sizes(passed, f"{world_size} ranks")
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

_BUCKET_CAP_MB = 600 / 2 ** 20  # 600 bytes: the tiny MLP's 6 parameters fall into several buckets


def _bucket_harness(answer_cls, steps, lr, bucket_cap_mb):
    import torch

    from ..parallel.data import make_buckets
    model, x, y = _tiny_problem()
    xs, ys = _my_shard(x, y)
    calls, flags = [], dict(step=-1, during_backward=False)
    expected_buckets = len(make_buckets(model.parameters(), bucket_cap_mb))
    restore = _spy_all_reduce(calls, flags)
    try:
        dp = answer_cls(model, bucket_cap_mb=bucket_cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        grads = None
        for step in range(steps):
            flags.update(step=step)
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.mse_loss(dp(xs), ys)
            flags.update(during_backward=True)
            loss.backward()
            flags.update(during_backward=False)
            dp.finish_gradient_synchronization()
            if step == 0:
                grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
    finally:
        restore()
    calls = [c for c in calls if c["step"] >= 0]  # not the broadcasts' or set-up's
    return dict(grads=grads, state=[p.detach().clone() for p in model.parameters()], calls=calls,
                expected_buckets=expected_buckets, num_params=len(list(model.parameters())))


@exercise("bucket_data_parallel")
def _check_bucket(answer, grader):
    ref = _reference(_DP_STEPS, _DP_LR)
    passed = []
    for world_size in _WORLD_SIZES:
        outs = grader.run(world_size, _bucket_harness, answer, _DP_STEPS, _DP_LR, _BUCKET_CAP_MB)
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
    overlapped = bool(calls) and all(c["during_backward"] and c["async_op"] for c in calls)
    if not calls:
        hint = "no all_reduce was called at all"
    elif not all(c["during_backward"] for c in calls):
        hint = ("the all-reduces started after backward had finished: start each bucket's all_reduce from the "
                "gradient hook, as soon as the bucket is full, so it overlaps the rest of backward")
    else:
        hint = ("pass async_op=True and keep the handle: a blocking all_reduce in the hook stalls backward until "
                "the message is through, so nothing overlaps; wait on the handles in finish_gradient_synchronization")
    yield Result("all-reduces start during backward, asynchronously (overlap)", overlapped, hint)


# ---- lesson 03: gradient accumulation with no_sync ----

_ACC_STEPS, _ACC_LR = 2, 0.1
_ACC_CASES = ((2, 3), (3, 4), (4, 2))  # (world size, k): each rank's 24 / world samples split into k micro-batches


def _accumulation_harness(answer, k, steps, lr):
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..lessons.data_parallel import count_all_reduces
    from ..parallel.accumulate import split_micro_batches
    model, x, y = _tiny_problem()
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
    ref = _reference(_ACC_STEPS, _ACC_LR)
    comm, passed = [], []
    for world_size, k in _ACC_CASES:
        unscaled = _reference(_ACC_STEPS, _ACC_LR * k)  # loss not divided by k: k times the step
        outs = grader.run(world_size, _accumulation_harness, answer, k, _ACC_STEPS, _ACC_LR)
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
