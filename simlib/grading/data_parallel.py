"""Checks for lessons 02-03: averaged gradients and accumulation with no_sync; lesson 01's ring all-reduce is in
:mod:`simlib.grading.ring`, lesson 02's buckets in :mod:`simlib.grading.bucket` (imported here, so importing this
module registers all four)."""

from __future__ import annotations

from . import bucket, ring  # noqa: F401 - they register their exercises
from .contracts import passes_breach, watch_passes
from .core import Result, exercise
from .dp_common import (  # noqa: F401 - re-exported
    _BATCHES,
    _BATCHES_5,
    _DP_LR,
    _DP_STEPS,
    _WORLD_SIZES,
    _all_close,
    _check_training,
    _diagnose_grads,
    _draw_problem,
    _my_shard,
    _problem_words,
    _reference,
    _tiny_problem,
    alive,
    dp_problem,
    dp_shrunk,
    only_some_sizes,
)
from .ring import _ring_cases, ring_case  # noqa: F401 - re-exported

# ---- lesson 02: average gradients (naive data parallelism) ----

_AVG_WORLDS = _WORLD_SIZES + (5,)


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
    return dict(
        local=local,
        grads=grads,
        state=[p.detach().clone() for p in model.parameters()],
        moved=moved,
        numel=sum(p.numel() for p in with_grad),
        tensors=len(with_grad),
    )


@exercise("average_gradients")
def _check_average_gradients(answer, grader):
    # drawn now from the OS's randomness; a frozen parameter (requires_grad=False) and one the forward never uses
    # on every size: their p.grad is None (the missing `if p.grad is not None` guard)
    from hypothesis import strategies as st

    from .instances import draw

    # and float32 or float64 models, at least one float64 (a buffer in the default float32 rounds its gradients)
    # 2 to 5 ranks (5: a second world size that is not a power of two, where a divisor written for 3 is wrong too;
    # its global batch splits five ways)
    sizes = st.tuples(
        *(dp_problem(True, True, ("float32", "float64"), _BATCHES_5 if w == 5 else _BATCHES) for w in _AVG_WORLDS)
    )
    sizes = sizes.filter(lambda problems: any(p["dtype"] == "float64" for p in problems))
    for _ in range(8):  # again while a layer is dead (all its ReLUs off: zero gradients hide a wrong scale)
        problems = dict(zip(_AVG_WORLDS, draw(sizes, 1)[0]))
        if all(alive(p) for p in problems.values()):
            break
    passed, shrunk = [], False

    def differs(world, p):  # what the answer gets wrong on (world, p), "" where it is right: for the shrinking
        ref = _reference(_DP_STEPS, _DP_LR, p)
        outs = grader.run(world, _average_gradients_harness, answer, _DP_STEPS, _DP_LR, p)
        ok, detail, _ = _diagnose_grads(outs, ref)
        trained = _check_training(outs, ref, world, _DP_STEPS)
        return (f"gradients: {detail}" if not ok else "") or ("" if trained.passed else f"weights: {trained.detail}")

    for world_size in _AVG_WORLDS:
        problem = problems[world_size]
        ref = _reference(_DP_STEPS, _DP_LR, problem)
        outs = grader.run(world_size, _average_gradients_harness, answer, _DP_STEPS, _DP_LR, problem)
        ok, detail, hint = _diagnose_grads(outs, ref)
        trained = _check_training(outs, ref, world_size, _DP_STEPS)
        smallest = ""
        if not shrunk and not (ok and trained.passed):  # once: the smallest instance that fails, for the hint
            right = tuple(w for w in _AVG_WORLDS if f"{w} ranks" in passed)
            shrunk, smallest = True, dp_shrunk(grader, problem, world_size, differs, passed=right, worlds=_AVG_WORLDS)
        hint += "" if ok else only_some_sizes(passed, f"{world_size} ranks") + _problem_words(problem) + smallest
        trained.hint += smallest if ok else ""
        passed += [f"{world_size} ranks"] if ok else []
        yield Result(f"{world_size} ranks: gradients equal the global-batch gradient", ok, hint, detail)
        yield trained
        # the contract: one all-reduce's volume per step, 2(n-1)/n of the gradients per rank (+ uneven ring chunks)
        n, worst = world_size, max(outs, key=lambda o: o["moved"])
        bound = 2 * (n - 1) / n * worst["numel"] + 2 * (n - 1) * worst["tensors"]
        yield Result(
            f"{world_size} ranks: moves no more than one all-reduce of the gradients",
            worst["moved"] <= bound,
            "averaging gradients is one all-reduce: each rank puts 2(n-1)/n of the gradients on the wire "
            "(nccl-tests' bus factor). Gathering every rank's whole gradient (all_gather, then the mean) "
            "moves (n-1)x the gradients per rank, and a reduce to one rank then a broadcast twice the "
            "gradients: call dist.all_reduce(p.grad) and divide by the world size",
            f"a rank moved {worst['moved']:,.0f} elements in one step; one all-reduce of its "
            f"{worst['numel']:,} gradient elements moves {2 * (n - 1) / n * worst['numel']:,.0f}",
        )


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
        per_step.append(
            dict(forwards=list(passes["forwards"]), backwards=passes["backwards"], overlapped=passes["overlapped"])
        )
    return dict(
        state=[p.detach().clone() for p in model.parameters()],
        calls=counter["calls"],
        per_sync=probe_count["calls"],
        passes=per_step,
        micro_rows=max(len(mx) for mx, _ in micro_batches),
    )


@exercise("accumulate_no_sync")
def _check_accumulation(answer, grader):
    problem = _draw_problem(frozen=True)  # drawn now; a frozen parameter (DDP leaves it out of its buckets)
    ref = _reference(_ACC_STEPS, _ACC_LR, problem)
    comm, passed, shrunk = [], [], False

    def differs(world, p, k):  # what the answer gets wrong on (world, p, k), "" where it is right: for the shrinking
        outs = grader.run(world, _accumulation_harness, answer, k, _ACC_STEPS, _ACC_LR, p)
        trained = _check_training(outs, _reference(_ACC_STEPS, _ACC_LR, p), world, _ACC_STEPS)
        return "" if trained.passed else f"weights after {_ACC_STEPS} steps: {trained.detail}"

    for world_size, k in _acc_cases(problem):
        unscaled = _reference(_ACC_STEPS, _ACC_LR * k, problem)  # loss not divided by k: k times the step
        outs = grader.run(world_size, _accumulation_harness, answer, k, _ACC_STEPS, _ACC_LR, problem)
        result = _check_training(outs, ref, world_size, _ACC_STEPS)
        result.name = result.name.replace(f"{world_size} ranks:", f"{world_size} ranks, k = {k} micro-batches:")
        drifted = not all(_all_close(o["state"], outs[0]["state"], rtol=0, atol=0) for o in outs)
        smallest = ""
        if not result.passed and not shrunk:  # once: the smallest instance that fails, for the hint
            right = tuple(w for w in _WORLD_SIZES if any(f"on {w} ranks" in words for words in passed))
            shrunk, smallest = True, dp_shrunk(grader, problem, world_size, differs, k=k, passed=right)
        if result.passed:
            pass
        elif all(_all_close(o["state"], unscaled["state"]) for o in outs):
            result.hint = (
                f"your update is {k}x too large: the {k} micro-batch gradients add up, so "
                f"divide each micro-batch's loss by k = {k} (a mean of means)"
            )
        elif drifted:
            result.hint += (
                ". Is the last micro-batch's backward outside no_sync()? Only that backward "
                "all-reduces the accumulated gradients. And is there one optimizer.step() after the "
                "loop? A step inside it uses gradients no rank has shared yet. The last micro-batch is "
                f"i == len(micro_batches) - 1 (here k = {k}; other checks draw other k: do not hard-code it)"
            )
        else:
            result.hint += (
                f". Check: one optimizer.step() and one optimizer.zero_grad() per call, after the loop "
                f"over the micro-batches, and each loss divided by k = len(micro_batches) (here {k}; "
                "other checks use other k: do not hard-code it)"
            )
        if not result.passed:
            result.hint += only_some_sizes(passed, f"k = {k} on {world_size} ranks") + smallest
        else:
            passed.append(f"k = {k} on {world_size} ranks")
        yield result
        yield Result(
            f"{world_size} ranks, k = {k}: the replicas stay identical",
            not drifted,
            "the ranks' weights differ: some optimizer step used gradients that were not all-reduced "
            "(the last backward inside no_sync(), or a step inside the loop)",
        )
        breach = passes_breach(outs, k)
        yield Result(
            f"{world_size} ranks, k = {k}: {k} micro-batch forwards and backwards per step, one at a time",
            not breach,
            f"accumulation is the algorithm: run forward and backward on each of the {k} micro-batches in "
            "turn, so only one micro-batch's activations are alive at a time. One forward of the whole "
            f"batch (torch.cat of the micro-batches), or one backward of the summed losses, gives the same "
            f"gradients with {k}x the activation memory",
            breach,
        )
        comm.append((world_size, k, outs[0]["calls"], _ACC_STEPS * outs[0]["per_sync"]))
    bad = [(w, k, calls, want) for w, k, calls, want in comm if calls != want]
    if not bad:
        hint = ""
    elif all(calls == k * want for _, k, calls, want in bad):
        hint = "you all-reduced on every micro-batch: run backward inside ddp.no_sync() for all but the last one"
    elif all(calls == 0 for _, _, calls, _ in bad):
        hint = "no all-reduce at all: the last micro-batch's backward must run outside no_sync()"
    else:
        hint = (
            "expected one synced backward per optimizer step: no_sync() on every micro-batch but the last, "
            "i == len(micro_batches) - 1 (do not hard-code k)"
        )
    yield Result(
        "communicates once per optimizer step (no_sync on all micro-batches but the last)",
        not bad,
        hint,
        "; ".join(
            f"{w} ranks, k = {k}: {calls} all-reduce calls in {_ACC_STEPS} steps, expected {want}"
            for w, k, calls, want in bad
        ),
    )
