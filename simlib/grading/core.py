"""The grader's machinery: results, the per-exercise registry, the checking loop on warm clusters.

The package (``simlib.grading``) re-exports it and imports the exercise modules, which register their checks
with :func:`exercise`; those modules import from here, never from the package, so nothing imports in a circle.
"""

from __future__ import annotations

import traceback

from .failures import _BROKE, _NOT_PLAIN, _UNSENDABLE, _broke_hint, _first_failure, _primary  # noqa: F401
from .fingerprint import PIECE_CHECKS, fingerprint, remember
from .grader import Grader, _clusters, close, cluster  # noqa: F401
from .results import (  # noqa: F401
    _MARK,
    _TODO_HINT,
    _TODO_NAME,
    ERROR,
    FAIL,
    HANG,
    PASS,
    TODO,
    Report,
    Result,
    _Enough,
    _last_line,
    _not_implemented,
    _Stop,
)
from .sent import ProcessGroupBroken, Sent, _guarded, _open, _probe, _what_broke  # noqa: F401

__all__ = [
    "check",
    "exercise",
    "Result",
    "Report",
    "Grader",
    "EXERCISES",
    "close",
    "cluster",
    "max_error",
    "ProcessGroupBroken",
]

EXERCISES: dict = {}


def exercise(name: str):
    """Register a generator ``fn(answer, grader) -> Results`` as the checks of exercise ``name``."""

    def register(fn):
        EXERCISES[name] = fn
        return fn

    return register


def check(
    name: str,
    answer,
    clusters: dict | None = None,
    timeout: float = 30.0,
    quiet: bool = False,
    first_failure: bool = False,
) -> Report:
    """Run every check of exercise ``name`` on ``answer`` (the learner's function or class).

    ``clusters``: {world_size: Cluster} to use (default: warm ones kept by this module, see :func:`close`).
    Prints one line per check unless ``quiet``; returns the :class:`Report`. ``first_failure``: once a check has
    failed, make no further run on the workers (the results of the runs made are all kept) — for the tests of
    planted wrong answers, which need only the check that catches each one; a learner sees every check.
    """
    report = Report(name)
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    if name not in EXERCISES:
        report.results.append(
            Result(
                f"exercise {name!r} exists",
                False,
                status=ERROR,
                hint=f"known exercises: {', '.join(sorted(EXERCISES))}",
            )
        )
        say(report.results[-1].line())
        return report
    say(f"checking {name} ...")
    grader = Grader(clusters, timeout, first_failure, unanswered=answer is None)
    try:  # from here on the answer is bytes, opened only in the workers (notebook mode and `simlib grade` alike)
        answer = Sent.of(answer)
    except Exception as exc:  # noqa: BLE001 - cloudpickle could not send it
        report.results.append(
            Result(
                "your code can be sent to the workers",
                False,
                status=ERROR,
                detail=f"{type(exc).__name__}: {exc}"[:500],
                hint=_UNSENDABLE,
            )
        )
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
        report.results.append(
            Result(
                "your code ran without an exception",
                False,
                status=ERROR,
                detail=f"{type(exc).__name__}: {exc}",
                hint=_last_line(tb),
            )
        )
        say(report.results[-1].line())
    if report.passed and name in PIECE_CHECKS:  # a project's piece: a pieces milestone need not grade it again
        remember(name, grader.ask(fingerprint, answer, what="your code"))
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
    own solution must pass every check, with at least four checks, and a multi-rank exercise (not a milestone, which
    re-runs a project's run at its own world size) must have been run on 2, 3 and 4 ranks (3 catches code right
    only for even splits or powers of two): otherwise the check raises, so
    the notebook's run fails. A learner's kernel never sets it."""
    import os

    if os.environ.get(STRICT) != "1":
        return
    lines = "\n".join(r.line() for r in report.results)
    assert report.passed, f"{report.exercise}: the solution does not pass ({STRICT}=1)\n{lines}"
    assert len(report.results) >= 4, f"{report.exercise}: only {len(report.results)} checks\n{lines}"
    asked = set(grader.probed) - {1}
    if report.exercise.endswith("_milestone"):  # a project's run, re-run at its own world size
        return
    assert not asked or {2, 3, 4} <= asked, f"{report.exercise}: run on {sorted(asked)} ranks, not 2, 3 and 4"


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
        torch.testing.assert_close(
            torch.as_tensor(actual), torch.as_tensor(expected), rtol=rtol, atol=atol, check_dtype=False
        )
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
