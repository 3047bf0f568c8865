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
