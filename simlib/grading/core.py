"""The grader's machinery: results, the per-exercise registry, the checking loop on warm clusters.

The package (``simlib.grading``) re-exports it and imports the exercise modules, which register their checks
with :func:`exercise`; those modules import from here, never from the package, so nothing imports in a circle.
"""
from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass, field

__all__ = ["check", "exercise", "Result", "Report", "Grader", "EXERCISES", "close", "cluster", "max_error",
           "ProcessGroupBroken"]

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


class _Enough(BaseException):  # passes through a check's own `except Exception`
    """Raised by Grader.run when the check asked for the first failure only (``check(first_failure=True)``) and a
    check has failed: the runs already made keep their results, no further run is made."""


def _not_implemented(type_name: str, message: str = "") -> bool:
    return type_name == "NotImplementedError"


def _last_line(tb: str) -> str:
    """The learner-facing part of a traceback: the last 'File ..., line N' and the error line."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    where = frames[-1] if frames else ""
    return f"{where}\n{lines[-1].strip()}" if lines else ""


_TODO_NAME = "not implemented yet: the exercise cell still raises NotImplementedError"  # not "implemented", a pass
_TODO_HINT = "replace `raise NotImplementedError()` in the exercise cell with your code, run that cell, then this one"


class ProcessGroupBroken(RuntimeError):
    """The learner's code destroyed or replaced the process group the grader's workers share."""


def _what_broke(world) -> str:
    import torch.distributed as dist
    if not dist.is_initialized():
        return "called dist.destroy_process_group()"
    if dist.group.WORLD is not world:
        return "replaced the process group (dist.init_process_group again)"
    return ""


class Sent:
    """A learner's answer as cloudpickle bytes: all the process that computes a verdict ever holds of it.

    ``grading.check`` wraps the answer in one (``simlib grade`` builds it from the bytes the learner's kernel sent,
    without unpickling them); :meth:`Grader.run` sends it to the workers, where :func:`_guarded` unpickles it
    before the harness runs. So the answer's ``__reduce__``, constructor, properties and methods run only in
    worker processes, and what comes back is plain data (``Cluster.call(..., plain=True)``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = bytes(data)

    @classmethod
    def of(cls, answer) -> Sent | None:
        """The answer as bytes; ``None`` (an unanswered exercise) stays ``None``: it is no answer, and the grader
        starts nothing for it (issue 51)."""
        import cloudpickle
        if answer is None:
            return None
        return answer if type(answer) is cls else cls(cloudpickle.dumps(answer))

    def __repr__(self) -> str:
        return f"<the learner's answer, {len(self.data):,} bytes, opened only in a worker>"


def _open(value):
    """In a worker: the learner's object for a :class:`Sent`, anything else as it is."""
    if type(value) is Sent:
        import cloudpickle
        return cloudpickle.loads(value.data)
    return value


def _guarded(harness, args, kwargs):
    """Run ``harness`` on this rank (the learner's answer unpickled here, in the worker), then check that the
    learner's code left the process group alone."""
    import torch.distributed as dist
    world = dist.group.WORLD
    try:
        args, kwargs = tuple(_open(a) for a in args), {k: _open(v) for k, v in kwargs.items()}
        out = harness(*args, **kwargs)
    except BaseException as exc:
        broke = _what_broke(world)
        if broke:
            raise ProcessGroupBroken(broke) from exc
        raise
    broke = _what_broke(world)
    if broke:
        raise ProcessGroupBroken(broke)
    return out


def _probe():
    """A healthy worker: its process group is up and every rank meets at a barrier."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise ProcessGroupBroken("no process group")
    dist.barrier()


# failures that are only the echo of another rank's problem (its peer died, left, or never came)
_ECHO = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "peer", "socket",
         "default process group has not been initialized")


def _primary(failures):
    """The failure that says what the learner's code did, on the rank that did it (not another rank's echo)."""
    def rank_of(f):
        if f.type_name == "ProcessGroupBroken":
            return 0
        if f.type_name == "WorkerDied" and "SIGTERM" not in f.message and "without reporting" not in f.message:
            return 1  # a known cause; SIGTERM or no status: most likely stopped after another rank's death
        if f.type_name == "SystemExit":
            return 2
        if f.type_name == "WorkerDied":
            return 5 if "SIGTERM" in f.message else 4  # SIGTERM: the agent stops the others after a death
        if any(word in f.message.lower() for word in _ECHO) or f.type_name in ("DistBackendError", "Timeout"):
            return 6
        return 3
    order = {id(f): i for i, f in enumerate(failures)}  # the order they arrived in: the first death is the cause
    return min(failures, key=lambda f: (rank_of(f), order[id(f)])) if failures else None


_BROKE = ("ProcessGroupBroken", "SystemExit", "WorkerDied")
_NOT_PLAIN = ("NotPlain", "Refused")  # a worker sent back something the grader does not read (simlib.plain)
_UNSENDABLE = ("the workers receive your function or class by value: it must not hold an open cluster, file or "
               "lock. Define what it needs inside the cell.")


def _broke_hint(failure) -> tuple[str, str]:
    """(detail, hint) for a learner's code that broke its worker or the process group."""
    shared = ("the grader's workers are shared by every check: leave the process group to the grader and let "
              "your function return. (The workers were restarted.)")
    if failure.type_name == "ProcessGroupBroken":
        return (f"rank {failure.rank}: your code {failure.message}",
                f"your code {failure.message} on rank {failure.rank}: " + shared)
    if failure.type_name == "SystemExit":
        return (f"rank {failure.rank}: your code called sys.exit()",
                f"your code called sys.exit() (or exit()) on rank {failure.rank}: return a value instead. " + shared)
    if "SIGABRT" in failure.message:  # Gloo aborts when a send and its recv disagree on the size
        return (f"rank {failure.rank}: the worker process ended: {failure.message}",
                f"rank {failure.rank}'s worker process was aborted while running your code: Gloo aborts a process "
                "when a send and the matching recv disagree on the message size (or a collective's tensors differ "
                "across ranks). Both sides of each send/recv must agree on every chunk's length; print them per "
                "rank and step. (The workers were restarted.)")
    return (f"rank {failure.rank}: the worker process ended: {failure.message}",
            f"rank {failure.rank}'s worker process ended while running your code ({failure.message}). Did your "
            "code call os._exit(), kill the process, or crash native code (a segfault)? " + shared)


class Grader:
    """Runs harnesses for an exercise on warm clusters (one per world size), with a time limit.

    Every check starts from healthy workers: the first run on each world size probes its cluster (process
    group up, a barrier) and restarts it when a learner's earlier code broke it.
    """

    def __init__(self, clusters: dict | None = None, timeout: float = 30.0, first_failure: bool = False,
                 unanswered: bool = False):
        self.clusters = clusters or {}
        self.timeout = timeout  # on a quiet machine; each run's limit is scaled by the machine's load (busy.py)
        self.probed = set()
        self.first_failure, self.failed = first_failure, False
        self.unanswered = unanswered  # no answer at all: a run is "not implemented yet", and no cluster starts
        self.busy_notes: list = []  # "your machine was busy ..." for every run that needed its second chance

    def cluster(self, world_size: int):
        c = self.clusters.get(world_size) or cluster(world_size)
        if world_size not in self.probed:
            self.probed.add(world_size)
            self.ensure_healthy(c)
        return c

    @staticmethod
    def ensure_healthy(c) -> None:
        from ..launch import WorkerError
        try:
            c.call(_probe, timeout=10.0, plain=True)
        except WorkerError:
            c.restart()

    def run(self, world_size: int, harness, *args, what: str | None = None, **kwargs) -> list:
        """``harness(*args, **kwargs)`` on every rank -> per-rank results; a failure ends the exercise."""
        import time

        from ..launch import WorkerError, WorkerTimeout
        from .busy import Load, limit_for
        what = what or f"your code on {world_size} ranks"
        if self.unanswered:
            raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT))
        if self.first_failure and self.failed:
            raise _Enough
        cluster_ = self.cluster(world_size)
        load = Load.now(world_size)  # the machine as it is at this moment: the limit scales with it
        limit = limit_for(self.timeout, load)
        t0 = time.monotonic()
        try:
            try:
                return cluster_.call(_guarded, (harness, args, kwargs), timeout=limit, plain=True)
            except WorkerTimeout as first:
                broke = _primary([f for f in first.failures.values() if f.type_name != "Timeout"])
                if broke is not None and broke.type_name in _BROKE:
                    raise
                # a second chance before the word "hang": the machine re-measured, a longer limit (issue 51)
                load = Load.now(world_size)
                limit = limit_for(self.timeout, load, retry=True)
                self.busy_notes.append(load.sentence(limit))
                t0 = time.monotonic()
                return cluster_.call(_guarded, (harness, args, kwargs), timeout=limit, plain=True)
        except WorkerTimeout as exc:
            broke = _primary([f for f in exc.failures.values() if f.type_name != "Timeout"])
            if broke is not None and broke.type_name in _BROKE:
                detail, hint = _broke_hint(broke)
                raise _Stop(Result(f"{what} finished", False, status=ERROR, detail=detail, hint=hint)) from None
            elapsed = time.monotonic() - t0
            why = (f"no answer within {limit:g} s (retried once after {load.sentence(limit)})" if exc.failures and all(
                       f.type_name == "Timeout" for f in exc.failures.values()) else
                   f"a send/recv or collective waited longer than {cluster_.timeout:g} s for its peer")
            raise _Stop(Result(f"{what} finished", False, status=HANG,
                               detail=f"stopped after {elapsed:.0f} s: {why} (a hang or a deadlock)",
                               hint="every send needs a matching recv on the other rank, and every rank must "
                                    "call the same collectives in the same order. A blocking send on every rank "
                                    "at once can deadlock: post isend/irecv first, then wait. (The workers were "
                                    "restarted.)\n" + _first_failure(exc))) from None
        except WorkerError as exc:
            failures = list(exc.failures.values())
            if failures and all(_not_implemented(f.type_name) for f in failures):
                raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT)) from None
            todo = [f for f in failures if _not_implemented(f.type_name)]
            if todo:
                raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT)) from None
            failure = _primary(failures)
            if failure is not None and failure.type_name in _NOT_PLAIN:
                raise _Stop(Result(f"{what} sent back only plain data", False, status=ERROR, detail=failure.summary(),
                                   hint="the grader reads back from its workers only plain data of exact types "
                                        "(numbers, strings, lists, dicts, plain tensors): return those, not your "
                                        "own classes or subclasses of them")) from None
            if failure is not None and failure.type_name in _BROKE:  # the cluster restarts on its next call
                detail, hint = _broke_hint(failure)
                raise _Stop(Result(f"{what} ran without breaking its worker", False, status=ERROR, detail=detail,
                                   hint=hint)) from None
            detail = failure.summary() if failure else str(exc).splitlines()[0]
            raise _Stop(Result(f"{what} ran without an exception", False, status=ERROR, detail=detail,
                               hint=_last_line(failure.traceback) if failure else "")) from None
        except (TypeError, AttributeError, ValueError) as exc:  # cloudpickle could not send the answer
            if "pickle" in str(exc).lower() or "serializ" in str(exc).lower():
                raise _Stop(Result("your code can be sent to the workers", False, status=ERROR, detail=str(exc),
                                   hint=_UNSENDABLE)) from None
            raise


    def ask(self, harness, *args, what: str | None = None):
        """``harness(*args)`` on a one-process worker -> its plain result: what a check needs to know of the answer
        (its type, what it returns) is computed there, never in this process."""
        return self.run(1, harness, *args, what=what or "your code")[0]


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


def check(name: str, answer, clusters: dict | None = None, timeout: float = 30.0, quiet: bool = False,
          first_failure: bool = False) -> Report:
    """Run every check of exercise ``name`` on ``answer`` (the learner's function or class).

    ``clusters``: {world_size: Cluster} to use (default: warm ones kept by this module, see :func:`close`).
    Prints one line per check unless ``quiet``; returns the :class:`Report`. ``first_failure``: once a check has
    failed, make no further run on the workers (the results of the runs made are all kept) — for the tests of
    planted wrong answers, which need only the check that catches each one; a learner sees every check.
    """
    report = Report(name)
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    if name not in EXERCISES:
        report.results.append(Result(f"exercise {name!r} exists", False, status=ERROR,
                                     hint=f"known exercises: {', '.join(sorted(EXERCISES))}"))
        say(report.results[-1].line())
        return report
    say(f"checking {name} ...")
    grader = Grader(clusters, timeout, first_failure, unanswered=answer is None)
    try:  # from here on the answer is bytes, opened only in the workers (notebook mode and `simlib grade` alike)
        answer = Sent.of(answer)
    except Exception as exc:  # noqa: BLE001 - cloudpickle could not send it
        report.results.append(Result("your code can be sent to the workers", False, status=ERROR,
                                     detail=f"{type(exc).__name__}: {exc}"[:500], hint=_UNSENDABLE))
        say(report.results[-1].line())
        return report
    shown = set()

    def show(result):  # a hint already shown is not repeated: "same hint as above"
        line = result.line()
        if not result.passed and result.hint and result.hint in shown:
            line = Result(result.name, False, "same as above", result.detail, result.status).line()
        shown.add(result.hint)
        say(line)

    try:
        for result in EXERCISES[name](answer, grader):
            report.results.append(result)
            grader.failed = grader.failed or not result.passed
            show(result)
    except _Enough:
        pass
    except _Stop as stop:
        report.results.append(stop.result)
        show(stop.result)
    except KeyboardInterrupt:
        raise
    except NotImplementedError:
        report.results.append(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT))
        say(report.results[-1].line())
    except Exception as exc:  # noqa: BLE001 - learner code run here, or a grader bug: report, never raise
        tb = traceback.format_exc()
        report.results.append(Result("your code ran without an exception", False, status=ERROR,
                                     detail=f"{type(exc).__name__}: {exc}", hint=_last_line(tb)))
        say(report.results[-1].line())
    for note in dict.fromkeys(grader.busy_notes):  # a right answer is never failed for the machine's load
        say(f"note: {note}")
    good = sum(r.passed for r in report.results)
    if report.passed:
        say(f"all {good} checks passed.")
    elif report.status == TODO:
        say(f"{name}: not implemented yet.")
    else:
        say(f"{good} of {len(report.results)} checks passed.")
    _strict(report, grader)
    return report


STRICT = "SIMLIB_GRADE_STRICT"  # "1": a check that does not pass raises (CI's run of the solutions notebooks)


def _strict(report: Report, grader: Grader) -> None:
    """Under ``SIMLIB_GRADE_STRICT=1`` (set by the test suite for the kernels that run ``solutions/``) the course's
    own solution must pass every check, with at least four checks, and a multi-rank exercise must have been run on
    2, 3 and 4 ranks (3 catches code right only for even splits or powers of two): otherwise the check raises, so
    the notebook's run fails. A learner's kernel never sets it."""
    import os
    if os.environ.get(STRICT) != "1":
        return
    lines = "\n".join(r.line() for r in report.results)
    assert report.passed, f"{report.exercise}: the solution does not pass ({STRICT}=1)\n{lines}"
    assert len(report.results) >= 4, f"{report.exercise}: only {len(report.results)} checks\n{lines}"
    asked = set(grader.probed) - {1}
    assert not asked or {2, 3, 4} <= asked, f"{report.exercise}: run on {sorted(asked)} ranks, not 2, 3 and 4"


_clusters: dict = {}


def cluster(world_size: int, timeout: float = 10.0):
    """A warm cluster of ``world_size`` ranks kept for the checks (collectives time out after ``timeout`` s)."""
    from ..launch import Cluster, OversubscribedWarning
    from .busy import Load, limit_for
    if world_size not in _clusters:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscribedWarning)
            # a peer's wait scales with the machine's load too: a busy peer is late, not gone
            _clusters[world_size] = Cluster(world_size, timeout=limit_for(timeout, Load.now(world_size)), threads=1,
                                            grace=2.0)
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


class UsedTheGrader(RuntimeError):
    """The answer called the grader's own code (its reference solver, its problem builders)."""


class AnswerTimeout(RuntimeError):
    """One call of the answer ran past its limit."""


ANSWER_CALL_LIMIT = 10.0  # seconds for one call of an answer that a check runs in its own process


def refuse_grader_calls(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in this process, refused (``UsedTheGrader``) if it calls into ``simlib/grading/``
    (an answer that returns the grader's reference proves nothing) and stopped (``AnswerTimeout``) after
    ``ANSWER_CALL_LIMIT`` seconds (in the main thread, where a timer signal can interrupt it)."""
    import os
    import signal
    import sys
    import threading
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    caught = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(here) and not caught:
            caught.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")

    def expire(*_):
        raise AnswerTimeout(f"one call of your function ran longer than {ANSWER_CALL_LIMIT:g} s")

    timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if timed:
        old_handler = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, ANSWER_CALL_LIMIT)
    old = sys.getprofile()
    sys.setprofile(watch)
    try:
        out = fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
    if caught:
        raise UsedTheGrader(f"your answer called the grader's own {caught[0]}")
    return out
