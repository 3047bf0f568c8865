"""Checks for the graded exercises: pass/fail with a hint that teaches, never a crashed kernel.

A learner's cell calls ``grading.check("ring_all_reduce", ring_all_reduce)``; each check prints one
line as it finishes (``✔`` / ``✘`` and a hint) and ``check`` returns a :class:`Report`. Rules:

- The learner's code runs on real worker processes (``simlib.Cluster``) with a time limit; an
  exception there is reported with its rank and last line, a hang as a hang (the workers restart).
- An untouched exercise (``raise NotImplementedError()``, the stub the generator writes) is reported as
  "not implemented yet", not as an error.
- Nothing the learner does makes ``check`` raise (except Ctrl-C, which stops it).

Adding checks for a new exercise (lessons 04+ do the same): write a generator decorated with
:func:`exercise` that takes ``(answer, grader)`` and yields :class:`Result` values. ``grader.run(world_size,
harness, *args)`` runs a module-level ``harness`` on every rank and returns the per-rank values; put
harnesses and checks in a section ``# ---- lesson NN: <topic> ----`` at the end of this file::

    @exercise("my_exercise")
    def _my_exercise(answer, grader):
        outs = grader.run(2, _my_harness, answer)          # stops the exercise cleanly on error/hang
        yield Result("equal to the reference on 2 ranks", ok, hint="what to look at when it is not")
"""
from __future__ import annotations

import sys
import traceback
import warnings
from dataclasses import dataclass, field

__all__ = ["check", "exercise", "Result", "Report", "Grader", "EXERCISES", "close", "cluster", "max_error"]

PASS, FAIL, TODO, ERROR, HANG = "pass", "fail", "not implemented", "error", "timeout"
_MARK = {PASS: "✔", FAIL: "✘", TODO: "…", ERROR: "✘", HANG: "✘"}


@dataclass
class Result:
    """One check: ``name`` (what it verifies), ``passed``, and a ``hint`` shown when it fails."""

    name: str
    passed: bool
    hint: str = ""
    detail: str = ""  # what was measured (e.g. "max error 3e-1 on rank 2")
    status: str = ""

    def __post_init__(self):
        self.status = self.status or (PASS if self.passed else FAIL)

    def line(self) -> str:
        text = f"{_MARK[self.status]} {self.name}"
        if self.detail and (not self.passed or self.status == PASS):
            text += f" ({self.detail})" if self.passed else f": {self.detail}"
        if not self.passed and self.hint:
            text += "\n    hint: " + self.hint.replace("\n", "\n          ")
        return text


@dataclass
class Report:
    exercise: str
    results: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def status(self) -> str:
        """"pass", "not implemented", "timeout", "error" or "fail" (the first problem found)."""
        for kind in (TODO, HANG, ERROR, FAIL):
            if any(r.status == kind for r in self.results):
                return kind
        return PASS if self.results else FAIL

    def failed(self) -> list:
        return [r for r in self.results if not r.passed]

    def __repr__(self) -> str:
        good = sum(r.passed for r in self.results)
        return f"<{self.exercise}: {good}/{len(self.results)} checks passed ({self.status})>"


class _Stop(Exception):
    """Raised by Grader.run to end an exercise early; carries the Result that explains why."""

    def __init__(self, result: Result):
        super().__init__(result.name)
        self.result = result


def _not_implemented(type_name: str, message: str = "") -> bool:
    return type_name == "NotImplementedError"


def _last_line(tb: str) -> str:
    """The learner-facing part of a traceback: the last 'File ..., line N' and the error line."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    where = frames[-1] if frames else ""
    return f"{where}\n{lines[-1].strip()}" if lines else ""


_TODO_HINT = "replace `raise NotImplementedError()` in the exercise cell with your code, run that cell, then this one"


class Grader:
    """Runs harnesses for an exercise on warm clusters (one per world size), with a time limit."""

    def __init__(self, clusters: dict | None = None, timeout: float = 30.0):
        self.clusters = clusters or {}
        self.timeout = timeout

    def cluster(self, world_size: int):
        return self.clusters.get(world_size) or cluster(world_size)

    def run(self, world_size: int, harness, *args, what: str | None = None, **kwargs) -> list:
        """``harness(*args, **kwargs)`` on every rank -> per-rank results; a failure ends the exercise."""
        from .launch import WorkerError, WorkerTimeout
        what = what or f"your code on {world_size} ranks"
        try:
            return self.cluster(world_size).call(harness, args, kwargs, timeout=self.timeout)
        except WorkerTimeout as exc:
            raise _Stop(Result(f"{what} finished", False, status=HANG,
                               detail=f"no answer within {self.timeout:g} s (a hang or a deadlock)",
                               hint="every send needs a matching recv on the other rank, and every rank must "
                                    "call the same collectives in the same order. A blocking send on every rank "
                                    "at once can deadlock: post isend/irecv first, then wait. (The workers were "
                                    "restarted.)\n" + _first_failure(exc))) from None
        except WorkerError as exc:
            failures = list(exc.failures.values())
            if failures and all(_not_implemented(f.type_name) for f in failures):
                raise _Stop(Result("implemented", False, status=TODO, hint=_TODO_HINT)) from None
            todo = [f for f in failures if _not_implemented(f.type_name)]
            failure = todo[0] if todo else min(failures, key=lambda f: f.rank) if failures else None
            if todo:
                raise _Stop(Result("implemented", False, status=TODO, hint=_TODO_HINT)) from None
            detail = failure.summary() if failure else str(exc).splitlines()[0]
            raise _Stop(Result(f"{what} ran without an exception", False, status=ERROR, detail=detail,
                               hint=_last_line(failure.traceback) if failure else "")) from None
        except (TypeError, AttributeError, ValueError) as exc:  # cloudpickle could not send the answer
            if "pickle" in str(exc).lower() or "serializ" in str(exc).lower():
                raise _Stop(Result("your code can be sent to the workers", False, status=ERROR, detail=str(exc),
                                   hint="the workers receive your function or class by value: it must not hold an "
                                        "open cluster, file or lock. Define what it needs inside the cell.")) from None
            raise


def _first_failure(exc) -> str:
    for f in sorted(getattr(exc, "failures", {}).values(), key=lambda f: f.rank):
        if f.type_name != "Timeout":
            return f"first report: {f.summary()}"
    return ""


EXERCISES: dict = {}


def exercise(name: str):
    """Register a generator ``fn(answer, grader) -> Results`` as the checks of exercise ``name``."""
    def register(fn):
        EXERCISES[name] = fn
        return fn
    return register


def check(name: str, answer, clusters: dict | None = None, timeout: float = 30.0, quiet: bool = False) -> Report:
    """Run every check of exercise ``name`` on ``answer`` (the learner's function or class).

    ``clusters``: {world_size: Cluster} to use (default: warm ones kept by this module, see :func:`close`).
    Prints one line per check unless ``quiet``; returns the :class:`Report`.
    """
    report = Report(name)
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    if name not in EXERCISES:
        report.results.append(Result(f"exercise {name!r} exists", False, status=ERROR,
                                     hint=f"known exercises: {', '.join(sorted(EXERCISES))}"))
        say(report.results[-1].line())
        return report
    say(f"checking {name} ...")
    grader = Grader(clusters, timeout)
    try:
        for result in EXERCISES[name](answer, grader):
            report.results.append(result)
            say(result.line())
    except _Stop as stop:
        report.results.append(stop.result)
        say(stop.result.line())
    except KeyboardInterrupt:
        raise
    except NotImplementedError:
        report.results.append(Result("implemented", False, status=TODO, hint=_TODO_HINT))
        say(report.results[-1].line())
    except Exception as exc:  # noqa: BLE001 - learner code run here, or a grader bug: report, never raise
        tb = traceback.format_exc()
        report.results.append(Result("your code ran without an exception", False, status=ERROR,
                                     detail=f"{type(exc).__name__}: {exc}", hint=_last_line(tb)))
        say(report.results[-1].line())
    good = sum(r.passed for r in report.results)
    if report.passed:
        say(f"all {good} checks passed.")
    elif report.status == TODO:
        say(f"{name}: not implemented yet.")
    else:
        say(f"{good} of {len(report.results)} checks passed.")
    return report


_clusters: dict = {}


def cluster(world_size: int, timeout: float = 10.0):
    """A warm cluster of ``world_size`` ranks kept for the checks (collectives time out after ``timeout`` s)."""
    from .launch import Cluster, OversubscribedWarning
    if world_size not in _clusters:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscribedWarning)
            _clusters[world_size] = Cluster(world_size, timeout=timeout, threads=1, grace=2.0)
    return _clusters[world_size]


def close() -> None:
    """Stop the grader's clusters (the last cell of an exercise notebook calls it)."""
    for c in list(_clusters.values()):
        c.close()
    _clusters.clear()


def max_error(actual, expected) -> float:
    """Largest absolute difference between two tensors (inf if the shapes differ)."""
    import torch
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if actual.shape != expected.shape:
        return float("inf")
    return float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0


def _close(actual, expected, rtol=1e-5, atol=1e-6) -> bool:
    import torch
    try:
        torch.testing.assert_close(torch.as_tensor(actual), torch.as_tensor(expected), rtol=rtol, atol=atol,
                                   check_dtype=False)
        return True
    except AssertionError:
        return False


# ---- shared by lessons 01-03: a tiny regression problem and its single-process reference ----

_PROBLEM = dict(width=16, depth=2, in_features=8, global_batch=24, seed=0)


def _tiny_problem():
    import torch

    from .models import MLP, make_regression
    torch.manual_seed(_PROBLEM["seed"])
    model = MLP(_PROBLEM["width"], _PROBLEM["depth"], in_features=_PROBLEM["in_features"])
    x, y = make_regression(_PROBLEM["global_batch"], _PROBLEM["in_features"], seed=_PROBLEM["seed"] + 1)
    return model, x, y


def _my_shard(x, y):
    import torch.distributed as dist

    from .models import shard
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
    if "local" in outs[0] and _all_close(got, outs[bad_ranks[0]]["local"], rtol=0, atol=0):
        return False, detail, ("the gradients did not change: all_reduce works in place on the tensor you pass, "
                               "so pass p.grad itself (not a copy) and divide it in place")
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

_RING_CASES = {2: [(8,), (7,)], 4: [(16,), (10,), (3,), (3, 4)]}


def _ring_harness(answer, shapes):
    import torch
    import torch.distributed as dist
    rank = dist.get_rank()
    out = []
    for i, shape in enumerate(shapes):
        g = torch.Generator().manual_seed(100 * i + rank)
        x = torch.randn(*shape, generator=g)
        expected = x.clone()
        dist.all_reduce(expected)
        used = []
        names = ("all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast", "reduce_scatter_tensor",
                 "all_gather_into_tensor")
        originals = {n: getattr(dist, n) for n in names}

        def spy(name):
            def call(*a, **kw):
                used.append(name)
                return originals[name](*a, **kw)
            return call
        for n in names:
            setattr(dist, n, spy(n))
        try:
            given = x.clone()
            returned = answer(given)
        finally:
            for n, f in originals.items():
                setattr(dist, n, f)
        result = returned if isinstance(returned, torch.Tensor) else given
        out.append(dict(shape=tuple(shape), result=result.detach().clone(), expected=expected,
                        in_place=torch.equal(given, result) if given.shape == result.shape else False,
                        used=sorted(set(used))))
    return out


def _ring_hint(cases_by_rank, world_size) -> str:
    from .collectives import chunk_bounds
    case = cases_by_rank[0]
    got = [c["result"].reshape(-1) for c in cases_by_rank]
    want = case["expected"].reshape(-1)
    if got[0].numel() != want.numel():
        return f"the result has {got[0].numel()} elements, the input {want.numel()}: keep the tensor's size"
    if all(_close(g, want / world_size) for g in got):
        return "you returned the mean: all_reduce's default (ReduceOp.SUM) is the sum; do not divide"
    bounds = chunk_bounds(want.numel(), world_size)
    wrong = {r: [i for i, (s, e) in enumerate(bounds) if e > s and not _close(got[r][s:e], want[s:e])]
             for r in range(world_size)}
    numel = want.numel()
    tail = numel // world_size * world_size
    if numel % world_size and all(_close(g[:tail], want[:tail]) for g in got):
        return (f"the last {numel - tail} element(s) are wrong: with {numel} elements on {world_size} ranks the "
                "chunks cannot all be numel // world_size long; cover every element (e.g. "
                "simlib.collectives.chunk_bounds or torch.tensor_split)")
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
    for world_size, shapes in _RING_CASES.items():
        outs = grader.run(world_size, _ring_harness, answer, shapes)
        for i, shape in enumerate(shapes):
            per_rank = [outs[r][i] for r in range(world_size)]
            kind = "any shape" if len(shape) > 1 else (
                f"numel < world_size" if shape[0] < world_size else
                "numel not divisible by world_size" if shape[0] % world_size else "numel divisible by world_size")
            ok = all(_close(c["result"], c["expected"]) for c in per_rank)
            detail = "" if ok else "max error %.2g" % max(max_error(c["result"], c["expected"]) for c in per_rank)
            hint = "" if ok else _ring_hint(per_rank, world_size)
            if not ok and len(shape) > 1 and all(c["result"].shape != c["expected"].shape for c in per_rank):
                hint = "work on tensor.view(-1) (a view: writes land in the tensor) and return the tensor itself"
            yield Result(f"{world_size} ranks, shape {shape} ({kind}): equals dist.all_reduce", ok, hint, detail)
        used = sorted({u for c in outs[0] for u in c["used"]})
        yield Result(f"{world_size} ranks: built from send/recv only", not used,
                     "the exercise is to build all-reduce from point-to-point messages: use dist.isend/irecv "
                     "(or send/recv), not a collective", f"called dist.{', dist.'.join(used)}" if used else "")
        in_place = all(c["in_place"] for per in outs for c in per)
        yield Result(f"{world_size} ranks: works in place and returns the tensor", in_place,
                     "like dist.all_reduce, work in place: write the result into the tensor you were given (tensor.view(-1) and "
                     "slices of it are views) and return it")


# ---- lesson 02: average gradients (naive data parallelism) ----

_DP_STEPS, _DP_LR = 2, 0.1


def _average_gradients_harness(answer, steps, lr):
    import torch
    model, x, y = _tiny_problem()
    xs, ys = _my_shard(x, y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = local = None
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        if step == 0:
            local = [p.grad.clone() for p in model.parameters()]
        answer(model)
        if step == 0:
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
    return dict(local=local, grads=grads, state=[p.detach().clone() for p in model.parameters()])


def _check_training(outs, ref, world_size, steps, extra_hint=""):
    ok = all(_all_close(out["state"], ref["state"]) for out in outs)
    same = all(_all_close(out["state"], outs[0]["state"], rtol=0, atol=0) for out in outs)
    detail = "" if ok else "max error %.2g" % max(max_error(a, b) for out in outs
                                                  for a, b in zip(out["state"], ref["state"]))
    hint = ("the ranks' weights differ from each other: the replicas drifted apart, so some gradients were not "
            "averaged across ranks" if not same else "the replicas agree with each other but not with the "
                                                        "single-process run on the global batch") + extra_hint
    return Result(f"{world_size} ranks: weights after {steps} steps equal the "
                  "single-process run on the global batch", ok, hint, detail)


@exercise("average_gradients")
def _check_average_gradients(answer, grader):
    ref = _reference(_DP_STEPS, _DP_LR)
    for world_size in (2, 4):
        outs = grader.run(world_size, _average_gradients_harness, answer, _DP_STEPS, _DP_LR)
        ok, detail, hint = _diagnose_grads(outs, ref)
        yield Result(f"{world_size} ranks: gradients equal the global-batch gradient", ok, hint, detail)
        yield _check_training(outs, ref, world_size, _DP_STEPS)


# ---- lesson 02: bucketed data parallelism with gradient hooks ----

_BUCKET_CAP_MB = 600 / 2 ** 20  # 600 bytes: the tiny MLP's 6 parameters fall into several buckets


def _bucket_harness(answer_cls, steps, lr, bucket_cap_mb):
    import torch

    from .parallel.data import make_buckets
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
    for world_size in (2, 4):
        outs = grader.run(world_size, _bucket_harness, answer, _DP_STEPS, _DP_LR, _BUCKET_CAP_MB)
        ok, detail, hint = _diagnose_grads(outs, ref)
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

_ACC_STEPS, _ACC_K, _ACC_LR = 2, 3, 0.1


def _accumulation_harness(answer, k, steps, lr):
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .parallel.accumulate import count_all_reduces, split_micro_batches
    model, x, y = _tiny_problem()
    probe = DDP(copy.deepcopy(model))  # how many all-reduces one synced backward makes (DDP's buckets)
    probe_count = count_all_reduces(probe)
    probe(x[:2]).sum().backward()
    ddp = DDP(model)
    counter = count_all_reduces(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    micro_batches = split_micro_batches(*_my_shard(x, y), k)
    for _ in range(steps):
        answer(ddp, opt, micro_batches, torch.nn.functional.mse_loss)
    return dict(state=[p.detach().clone() for p in model.parameters()], calls=counter["calls"],
                per_sync=probe_count["calls"])


@exercise("accumulate_no_sync")
def _check_accumulation(answer, grader):
    ref = _reference(_ACC_STEPS, _ACC_LR)
    unscaled = _reference(_ACC_STEPS, _ACC_LR * _ACC_K)  # loss not divided by k: k times the step
    for world_size in (2, 4):
        outs = grader.run(world_size, _accumulation_harness, answer, _ACC_K, _ACC_STEPS, _ACC_LR)
        result = _check_training(outs, ref, world_size, _ACC_STEPS)
        drifted = not all(_all_close(o["state"], outs[0]["state"], rtol=0, atol=0) for o in outs)
        if result.passed:
            pass
        elif all(_all_close(o["state"], unscaled["state"]) for o in outs):
            result.hint = (f"your update is {_ACC_K}x too large: the {_ACC_K} micro-batch gradients add up, so "
                           f"divide each micro-batch's loss by k = {_ACC_K} (a mean of means)")
        elif drifted:
            result.hint += (". Is the last micro-batch's backward outside no_sync()? Only that backward "
                            "all-reduces the accumulated gradients. And is there one optimizer.step() after the "
                            "loop? A step inside it uses gradients no rank has shared yet")
        else:
            result.hint += (". Check: one optimizer.step() and one optimizer.zero_grad() per call, after the loop "
                            "over the micro-batches, and each loss divided by k")
        yield result
        yield Result(f"{world_size} ranks: the replicas stay identical", not drifted,
                     "the ranks' weights differ: some optimizer step used gradients that were not all-reduced "
                     "(the last backward inside no_sync(), or a step inside the loop)")
    out = outs[0]
    want = _ACC_STEPS * out["per_sync"]
    if out["calls"] == _ACC_K * want:
        hint = f"you all-reduced on every micro-batch: run backward inside ddp.no_sync() for all but the last of the {_ACC_K}"
    elif out["calls"] == 0:
        hint = "no all-reduce at all: the last micro-batch's backward must run outside no_sync()"
    else:
        hint = f"expected {out['per_sync']} all-reduce(s) per optimizer step"
    yield Result("communicates once per optimizer step (no_sync on all micro-batches but the last)",
                 out["calls"] == want, hint, f"{out['calls']} all-reduce calls in {_ACC_STEPS} steps, expected {want}")


# ---- lesson 04: the 1F1B schedule, and a pipeline stage's forward/backward with send/recv ----

_PP = dict(width=16, depth=7, in_features=8, batch=16, num_microbatches=4, seed=0)


def _pp_problem(world_size):
    import torch

    from .models import MLP, make_regression
    torch.manual_seed(_PP["seed"])
    model = MLP(_PP["width"], _PP["depth"], in_features=_PP["in_features"], out_features=2)
    x, y = make_regression(_PP["batch"], _PP["in_features"], 2, seed=_PP["seed"])
    return model, x, y


def _pp_reference():
    import torch
    model, x, y = _pp_problem(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _learner_order(answer, rank, p, m):
    """The learner's compute order as (op, microbatch) pairs (Actions or tuples accepted)."""
    out = []
    for a in answer(rank, p, m):
        op, mb = (a.op, a.microbatch) if hasattr(a, "op") else (a[0], a[1])
        out.append((str(op), int(mb)))
    return out


def _schedule_from_orders(orders):
    from .parallel.schedules import with_communication
    p = len(orders)
    return [with_communication(r, p, [(op, mb, 0) for op, mb in order]) for r, order in enumerate(orders)]


def _pp_harness(orders, num_microbatches):
    import torch.distributed as dist

    from .parallel import pipeline
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = _pp_problem(world_size)
    stages = pipeline.build_stages(model.net, rank, world_size)
    out = pipeline.pipeline_step(_schedule_from_orders(orders), stages, x, y, num_microbatches=num_microbatches,
                                 activation_width=_PP["width"])
    return dict(loss=out["loss"], grads={n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def _grads_by_rank(outs, ref_grads):
    """Per rank: None if its stage's gradients equal the reference's, else the largest error."""
    errors = []
    for out in outs:
        got = out["grads"]
        if not got or any(n not in ref_grads for n in got):
            errors.append(float("inf"))
            continue
        bad = [max_error(g, ref_grads[n]) for n, g in got.items() if not _close(g, ref_grads[n])]
        errors.append(max(bad) if bad else None)
    return errors


@exercise("one_f_one_b")
def _check_one_f_one_b(answer, grader):
    from .parallel import schedules
    sizes = [(p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 8)]
    orders = {(p, m): [_learner_order(answer, r, p, m) for r in range(p)] for p, m in sizes}
    want = {(p, m): [[(a.op, a.microbatch) for a in schedules.compute_order(acts)]
                     for acts in schedules.one_f_one_b(p, m)] for p, m in sizes}
    # 1. every forward and backward exactly once, backward after forward
    bad = next(((p, m, r) for (p, m), o in orders.items() for r in range(p)
                if sorted(o[r]) != sorted(want[p, m][r])), None)
    yield Result("every rank runs each micro-batch's forward and backward exactly once", bad is None,
                 "return one ('forward', i) and one ('backward', i) per micro-batch i in range(num_microbatches)",
                 "" if bad is None else "p=%d, m=%d, rank %d returned %s" % (bad[0], bad[1], bad[2], orders[bad[:2]][bad[2]]))
    if bad is not None:
        return
    late = next(((p, m, r) for (p, m), o in orders.items() for r in range(p)
                 if any(o[r].index(("backward", i)) < o[r].index(("forward", i)) for i in range(m))), None)
    yield Result("each backward comes after its forward", late is None,
                 "a micro-batch's backward needs the activations its forward saved",
                 "" if late is None else "p=%d, m=%d, rank %d" % late)
    if late is not None:
        return
    # 2. deadlock-free with blocking receives
    stuck = None
    for (p, m), o in orders.items():
        try:
            schedules.check(_schedule_from_orders(o))
        except ValueError as exc:
            stuck = (p, m, str(exc))
            break
    yield Result("the schedule cannot deadlock (receives block, sends do not)", stuck is None,
                 "a rank waits for a gradient its neighbour can only send later. Rank r may run at most "
                 "p - r - 1 forwards (its warm-up) before it must run its first backward",
                 "" if stuck is None else "p=%d, m=%d: %s" % stuck)
    if stuck is not None:
        return
    # 3. 1F1B's memory bound: rank r holds at most p - r micro-batches' activations
    over = next(((p, m, r, schedules.peak_activations(_schedule_from_orders(o))[r])
                 for (p, m), o in orders.items() for r in range(p)
                 if schedules.peak_activations(_schedule_from_orders(o))[r] > min(p - r, m)), None)
    gpipe_like = over is not None and orders[over[:2]][over[2]] == [("forward", i) for i in range(over[1])] + [
        ("backward", i) for i in reversed(range(over[1]))]
    yield Result("at most p - rank micro-batches in flight on each rank (1F1B's memory bound)", over is None,
                 "this is GPipe's order (all forwards, then all backwards): start backwards after the warm-up"
                 if gpipe_like else "too many forwards before the first backward: the warm-up of rank r is "
                                    "p - r - 1 forwards, then alternate one forward and one backward",
                 "" if over is None else "p=%d, m=%d, rank %d holds %d" % over)
    # 4. the exact 1F1B order
    diff = next(((p, m, r) for (p, m), o in orders.items() for r in range(p) if o[r] != want[p, m][r]), None)
    hint = ""
    if diff is not None:
        p, m, r = diff
        got, exp = orders[p, m][r], want[p, m][r]
        i = next(k for k in range(len(exp)) if got[k] != exp[k])
        hint = (f"p={p}, m={m}, rank {r}: action {i} is {got[i]}, 1F1B has {exp[i]}. The warm-up is "
                "min(p - rank - 1, m) forwards; then for each remaining micro-batch one forward and the "
                "oldest backward; the cool-down runs the remaining backwards oldest first")
    yield Result("the order equals 1F1B on every rank (p = 1..4, m = 1..8)", diff is None, hint)
    # 5. for real: 2 ranks, gradients equal one process
    ref_loss, ref_grads = _pp_reference()
    m = _PP["num_microbatches"]
    outs = grader.run(2, _pp_harness, orders[2, m] if (2, m) in orders else None, m, what="the schedule on 2 ranks")
    errors = _grads_by_rank(outs, ref_grads)
    yield Result("run on 2 ranks by simlib's executor: gradients equal one process", all(e is None for e in errors),
                 "the executor runs your order; compare it with the lesson's 1F1B table",
                 "" if all(e is None for e in errors) else f"max errors by rank {errors}")


def _stage_harness(answer):
    import torch.distributed as dist

    from .parallel import pipeline
    from .parallel.pipeline import microbatches
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = _pp_problem(world_size)
    stage = pipeline.build_stages(model.net, rank, world_size)[0]
    m = _PP["num_microbatches"]
    xs, ys = microbatches(x, m), microbatches(y, m)
    loss = answer(stage, xs, ys, (xs[0].shape[0], _PP["width"]))
    loss = float(loss) if loss is not None else None
    return dict(loss=loss, grads={n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


@exercise("pipeline_stage")
def _check_pipeline_stage(answer, grader):
    ref_loss, ref_grads = _pp_reference()
    m = _PP["num_microbatches"]
    scaled = {n: g * m for n, g in ref_grads.items()}
    for world_size in (2, 4):
        outs = grader.run(world_size, _stage_harness, answer, what=f"your stage on {world_size} ranks")
        last = outs[-1]["loss"]
        ok_loss = last is not None and abs(last - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
        yield Result(f"{world_size} ranks: the last stage returns the batch loss", ok_loss,
                     f"return the sum over micro-batches of loss_i / {m} (the mean over micro-batches) on the last "
                     "stage" + (f"; yours is {last / ref_loss:.3g}x the right one" if last and ref_loss else ""),
                     "" if ok_loss else f"got {last}, want {ref_loss:.6f}")
        errors = _grads_by_rank(outs, ref_grads)
        ok = all(e is None for e in errors)
        hint, wrong = "", [r for r, e in enumerate(errors) if e is not None]
        if not ok:
            if all(e is None for e in _grads_by_rank(outs, scaled)):
                hint = (f"your gradients are {m}x the right ones: divide each micro-batch's loss by the number of "
                        f"micro-batches ({m}) so that they add up to the whole batch's mean")
            elif errors[-1] is None and (world_size < 3 or errors[-2] is not None):
                hint = ("the last stage is right but the stage before it is wrong: a stage that is not last must run "
                        "backward from its output with the gradient it received, torch.autograd.backward(y, grad) "
                        "(y.backward(grad)), not from a sum of its output")
            elif errors[-1] is None and errors[-2] is None:
                hint = ("the last two stages are right, earlier ones wrong: what you send back must be the gradient "
                        "with respect to this stage's *input*, x.grad (x received with requires_grad), not the "
                        "gradient you received")
            else:
                hint = ("compare your steps with the recipe: recv x (requires_grad), y = stage(x), send y.detach(); "
                        "then in reverse: recv grad, y.backward(grad), send x.grad")
        yield Result(f"{world_size} ranks: every stage's gradients equal one process on the whole batch", ok, hint,
                     "" if ok else f"wrong on rank(s) {wrong}")


# ---- lesson 05: column- and row-parallel Linear as autograd functions ----

_TP = dict(hidden=16, batch=2, seq=3, seed=0)


def _tp_problem():
    import torch

    from .models import FeedForward
    torch.manual_seed(_TP["seed"])
    dense = FeedForward(_TP["hidden"])
    x = torch.randn(_TP["batch"], _TP["seq"], _TP["hidden"])
    weights = torch.linspace(-1, 1, _TP["batch"] * _TP["seq"] * _TP["hidden"]).view_as(x)
    return dense, x, weights


def _tp_reference():
    dense, x, weights = _tp_problem()
    x.requires_grad_()
    y = dense(x)
    (y * weights).sum().backward()
    return dict(y=y.detach(), x_grad=x.grad, w1=dense.fc1.weight.grad, b1=dense.fc1.bias.grad,
                w2=dense.fc2.weight.grad, b2=dense.fc2.bias.grad, b2_value=dense.fc2.bias.detach())


def _tp_harness(answer):
    import torch
    import torch.distributed as dist
    column, row = answer
    rank, t = dist.get_rank(), dist.get_world_size()
    dense, x, weights = _tp_problem()
    n = dense.fc1.out_features // t
    rows = slice(rank * n, (rank + 1) * n)
    w1 = dense.fc1.weight[rows].detach().clone().requires_grad_()
    b1 = dense.fc1.bias[rows].detach().clone().requires_grad_()
    w2 = dense.fc2.weight[:, rows].detach().clone().requires_grad_()
    b2 = dense.fc2.bias.detach().clone().requires_grad_()
    x.requires_grad_()
    calls = []
    restore = _spy_all_reduce(calls, {"phase": "forward"})
    try:
        y = row.apply(torch.nn.functional.gelu(column.apply(x, w1, b1)), w2, b2)
        forward_calls = len(calls)
        (y * weights).sum().backward()
    finally:
        restore()
    return dict(y=y.detach(), x_grad=x.grad, w1=w1.grad, b1=b1.grad, w2=w2.grad, b2=b2.grad,
                forward_calls=forward_calls, backward_calls=len(calls) - forward_calls, rank=rank, rows=(rows.start, rows.stop))


@exercise("tp_linear")
def _check_tp_linear(answer, grader):
    ref = _tp_reference()
    for world_size in (2, 4):
        outs = grader.run(world_size, _tp_harness, answer, what=f"your layers on {world_size} ranks")
        ok_y = all(_close(o["y"], ref["y"]) for o in outs)
        hint = ""
        if not ok_y:
            if all(_close(o["y"], ref["y"] + (world_size - 1) * ref["b2_value"]) for o in outs):
                hint = (f"the bias of the row-parallel layer was added {world_size} times: every rank added it before "
                        "the all-reduce. Add it once, after the all-reduce")
            elif sum(o["forward_calls"] for o in outs) == 0:
                hint = ("each rank's row-parallel product x_r @ w_r.T is only a partial sum over its slice of the "
                        "input features: all-reduce it in forward (Megatron's g)")
            else:
                hint = "column-parallel forward is local (y_r = x @ w_r.T + b_r); the row-parallel output is all-reduced"
        yield Result(f"{world_size} ranks: output equal to the unsplit MLP", ok_y, hint,
                     "" if ok_y else "max error %.2g" % max(max_error(o["y"], ref["y"]) for o in outs))
        ok_x = all(_close(o["x_grad"], ref["x_grad"]) for o in outs)
        yield Result(f"{world_size} ranks: dL/dx equal to the unsplit MLP", ok_x,
                     "" if ok_x else "in the column-parallel backward, grad_y_r @ w_r is only this rank's share of "
                     "dL/dx (its slice of output features): all-reduce it (Megatron's f)",
                     "" if ok_x else "max error %.2g" % max(max_error(o["x_grad"], ref["x_grad"]) for o in outs))
        ok_w = True
        for o in outs:
            rows = slice(*o["rows"])
            want = dict(w1=ref["w1"][rows], b1=ref["b1"][rows], w2=ref["w2"][:, rows], b2=ref["b2"])
            ok_w &= all(o[k] is not None and _close(o[k], v) for k, v in want.items())
        yield Result(f"{world_size} ranks: weight gradients equal the slices of the unsplit ones", ok_w,
                     "" if ok_w else "weight gradients are local: grad_w = grad_y^T @ x on this rank's slice, and "
                     "grad_b = grad_y summed over batch and sequence; no all-reduce for them")
        counts = {(o["forward_calls"], o["backward_calls"]) for o in outs}
        ok_c = counts == {(1, 1)}
        yield Result(f"{world_size} ranks: one all-reduce in forward, one in backward", ok_c,
                     "" if ok_c else "the Megatron MLP needs exactly one all-reduce each way: the row-parallel output "
                     "in forward, the column-parallel input gradient in backward",
                     "" if ok_c else f"(forward, backward) all-reduces per rank: {sorted(counts)}")
