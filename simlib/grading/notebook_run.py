"""One notebook of a class, run and graded: its cells in a kernel of its own (the notebook's own checks made no-ops),
the graded objects exported by value, and the library's checks run on them with worker processes of the grader's
(:func:`grade_notebook`); one :class:`Row` per check. Used by :mod:`simlib.grading.batch` (``simlib grade``)."""

from __future__ import annotations

import io
import math
import secrets
import tempfile
import time
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from .core import Sent

# Runs first in the learner's kernel: the notebook's own checks become no-ops (the grader runs them itself).
_PREAMBLE = """
import simlib.grading as _simlib_grading
def _simlib_skipped_check(name, answer=None, *args, **kwargs):
    print(f"(grading.check({name!r}) not run here: `simlib grade` runs the checks itself)")
    return _simlib_grading.Report(str(name))
_simlib_grading.check = _simlib_skipped_check
_simlib_grading.close = lambda *args, **kwargs: None
del _simlib_skipped_check
"""

# Runs last: the graded objects, by value, into a file only the grader knows.
_EXPORT = """
def _simlib_export(names, path):
    import pickle
    import cloudpickle
    found = {{}}
    for name in names:
        if name not in globals():
            continue
        try:
            found[name] = cloudpickle.dumps(globals()[name])
        except Exception as exc:
            found[name] = "cannot be sent to the grader: " + type(exc).__name__ + ": " + str(exc)
    with open(path, "wb") as f:
        pickle.dump(found, f)
_simlib_export({names!r}, {path!r})
"""


@dataclass
class Row:
    submission: str
    exercise: str
    kind: str  # "run": the notebook's own run; "check": one of the library's checks
    check: str
    passed: bool
    status: str  # pass | fail | not implemented | error | timeout
    hint: str = ""
    detail: str = ""
    seconds: float = 0.0


def _course_root() -> Path:
    from ..exercises import ROOT

    return ROOT


def _official_entries(path: Path, nb, solutions: Path) -> list[dict]:
    """The exercise entries for a submission: from the course's solution notebook whose name the submission's
    file name ends with (``alice_01_ring_all_reduce.ipynb``, ``alice/01_ring_all_reduce.ipynb``); else the
    submission's own ``metadata.simlib`` if it names registered exercises."""
    import nbformat

    from .. import grading
    from ..exercises import exercises_of

    candidates = sorted(
        (p for p in solutions.glob("[0-9]*.ipynb") if path.name.endswith(p.name)), key=lambda p: -len(p.name)
    )
    if candidates:
        return exercises_of(nbformat.read(str(candidates[0]), as_version=4))
    try:
        entries = exercises_of(nb)
    except Exception:  # noqa: BLE001 - malformed metadata
        return []
    return [
        e
        for e in entries
        if isinstance(e, dict) and e.get("exercise") in grading.EXERCISES and isinstance(e.get("answer"), str)
    ]


def _execute(nb, names: list[str], timeout: float, kernel_name: str, workdir: Path) -> dict:
    """Run the notebook's code cells in a fresh kernel, then export ``names``; never raises."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = workdir / f"answers-{secrets.token_hex(8)}.pkl"
    cells = [nbformat.v4.new_code_cell(_PREAMBLE)]
    cells += [nbformat.v4.new_code_cell(c.source) for c in nb.cells if c.get("cell_type") == "code"]
    export = nbformat.v4.new_code_cell(_EXPORT.format(names=list(names), path=str(path)))
    run = nbformat.v4.new_notebook(cells=cells + [export])
    run.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name, "language": "python"}
    # the kernel's own log at ERROR: no "Kernel is running over TCP" warning per notebook (its port is on
    # 127.0.0.1; a Unix-socket transport was tried and left a grading run waiting on a kernel that had died)
    client = NotebookClient(
        run,
        timeout=max(1, int(timeout)),
        kernel_name=kernel_name,
        allow_errors=True,
        interrupt_on_timeout=True,
        startup_timeout=120,
        extra_arguments=["--log-level=ERROR"],
        resources={"metadata": {"path": str(workdir)}},
    )
    result = dict(answers={}, error="", status="pass", seconds=0.0)
    t0 = time.monotonic()
    try:
        with client.setup_kernel():
            client.timeout = 120  # the grader's own preparation (it imports simlib): not the learner's time
            client.execute_cell(run.cells[0], 0)
            failed = next((o for o in run.cells[0].get("outputs", []) if o.get("output_type") == "error"), None)
            if failed is not None:
                raise RuntimeError(
                    f"the grader could not prepare the kernel (is simlib installed for it?): "
                    f"{failed.get('ename')}: {failed.get('evalue')}"
                )
            deadline = time.monotonic() + timeout
            for index, cell in enumerate(run.cells[:-1]):
                if index == 0:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    result.update(status="timeout", error=f"the notebook did not finish within {timeout:g} s")
                    break
                client.timeout = max(1, math.ceil(remaining))
                stopped = False
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    stopped = True
                stopped = stopped or time.monotonic() >= deadline - 0.5  # nbclient interrupted it at the limit
                if stopped:
                    result.update(
                        status="timeout",
                        error=f"the notebook did not finish within {timeout:g} s "
                        f"(stopped in code cell {index}: {_first_line(cell)})",
                    )
                    break
                error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
                if error is not None and not result["error"]:
                    result.update(
                        status="error",
                        error=f"code cell {index} ({_first_line(cell)}): {error.get('ename')}: {error.get('evalue')}",
                    )
            client.timeout = 60  # the export gets its own minute, even after a time-out
            client.execute_cell(run.cells[-1], len(run.cells) - 1)
    except DeadKernelError as exc:
        result.update(status="error", error=f"the kernel died (the notebook's code crashed it): {exc}"[:500])
    except CellTimeoutError:
        result.update(status="timeout", error=result["error"] or "the kernel did not answer")
    except Exception as exc:  # noqa: BLE001 - a kernel that will not start, a broken notebook: report it
        result.update(status="error", error=f"{type(exc).__name__}: {exc}"[:500])
    result["seconds"] = time.monotonic() - t0
    if path.exists():
        from ..plain import NotPlain, pickle_loads

        try:  # written by the learner's kernel: read without building any class ({name: bytes or str} only)
            answers = pickle_loads(path.read_bytes(), "the notebook's objects")
            if type(answers) is not dict or not all(
                type(k) is str and type(v) in (bytes, str) for k, v in answers.items()
            ):
                raise NotPlain(f"expected {{name: bytes}}, got {type(answers).__name__}")
            result["answers"] = answers
        except (OSError, NotPlain) as exc:
            result.update(status="error", error=f"could not read the notebook's objects back: {exc}")
        path.unlink()
    return result


def _first_line(cell) -> str:
    lines = [ln for ln in cell.source.splitlines() if ln.strip()]
    return (lines[0][:60] + ("…" if len(lines[0]) > 60 else "")) if lines else "(empty)"


class _Clock(io.TextIOBase):
    """A stdout that notes when each check's line (starting with its mark) was printed."""

    def __init__(self, marks):
        self.marks, self.times, self.text = tuple(marks), [], []

    def write(self, s):
        for line in s.splitlines():
            if line.startswith(self.marks):
                self.times.append(time.monotonic())
        self.text.append(s)
        return len(s)


class WorkerPool:
    """Worker clusters for the checks, started on first use (``pool.get(world_size)``), closed by :meth:`close`.

    The grader uses a fresh pool per submission, so one learner's code cannot leave state in the workers that
    grade the next one; pass ``reuse=True`` to :func:`grade` to keep one pool for all (faster, trusted classes).
    """

    def __init__(self, clusters: dict | None = None):
        self._given = dict(clusters or {})
        self._started: dict = {}

    def get(self, world_size, default=None):
        if world_size in self._given:
            return self._given[world_size]
        if world_size not in self._started:
            from ..launch import Cluster, OversubscribedWarning

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OversubscribedWarning)
                self._started[world_size] = Cluster(world_size, timeout=10.0, threads=1, grace=2.0)
        return self._started[world_size]

    __getitem__ = get

    def __contains__(self, world_size) -> bool:
        return True

    def __bool__(self) -> bool:
        return True

    def close(self) -> None:
        for c in self._started.values():
            c.close()
        self._started.clear()


def note_rows(name: str, exercise: str, nb) -> list:
    """A ``note`` row (for the teacher, not a check: it passes) for each function of the submission whose structure
    is close to the library's own code for the exercise (:mod:`simlib.grading.similarity`)."""
    from .similarity import library_matches

    code = "\n\n".join(c.source for c in nb.cells if c.get("cell_type") == "code")
    return [
        Row(
            name,
            exercise,
            "note",
            f"`{mine}` is close to the library's {ref} (structure {ratio:.0%} alike)",
            True,
            "pass",
            hint="a note for the teacher, not a failure: the library is open and its code may be typed in",
            detail=f"similarity {ratio}",
        )
        for mine, ref, ratio in library_matches(exercise, code)
    ]


def _check_rows(name, exercise, answer, pool, check_timeout) -> list[Row]:
    from .. import grading

    marks = set(getattr(grading, "_MARK", {}).values()) or {"✔", "✘", "…"}
    clock = _Clock(marks)
    t0 = time.monotonic()
    try:
        with redirect_stdout(clock):
            report = grading.check(exercise, answer, clusters=pool, timeout=check_timeout)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - check() should never raise; if it does, it is one failed row
        return [
            Row(
                name,
                exercise,
                "check",
                "the checks ran",
                False,
                "error",
                detail=f"{type(exc).__name__}: {exc}",
                seconds=time.monotonic() - t0,
            )
        ]
    results = list(report.results)
    if len(clock.times) == len(results):
        ends = clock.times
    else:  # lines and results do not pair up: share the time out evenly
        total = time.monotonic() - t0
        ends = [t0 + total * (i + 1) / max(1, len(results)) for i in range(len(results))]
    starts = [t0] + ends[:-1]
    return [
        Row(
            name,
            exercise,
            "check",
            r.name,
            bool(r.passed),
            r.status,
            "" if r.passed else r.hint,
            r.detail,
            round(end - start, 3),
        )
        for r, start, end in zip(results, starts, ends)
    ]


def grade_notebook(
    path,
    timeout: float = 300.0,
    pool: WorkerPool | None = None,
    check_timeout: float = 30.0,
    solutions: Path | str | None = None,
    kernel_name: str = "python3",
) -> list[Row]:
    """Grade one submitted notebook; returns its rows. Never raises for anything the submission does."""
    import nbformat

    path = Path(path)
    name = str(path)
    solutions = Path(solutions) if solutions else _course_root() / "solutions"
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unreadable
        return [
            Row(
                name,
                "?",
                "run",
                "the submission is a notebook",
                False,
                "error",
                hint="submit the exercise's .ipynb file as saved by Jupyter",
                detail=f"{type(exc).__name__}: {exc}",
            )
        ]
    entries = _official_entries(path, nb, solutions)
    if not entries:
        known = ", ".join(sorted(p.name for p in solutions.glob("[0-9]*.ipynb")))
        return [
            Row(
                name,
                "?",
                "run",
                "the submission names a known exercise",
                False,
                "error",
                hint=f"keep the exercise's file name (one of: {known})",
            )
        ]
    own_pool = pool is None
    pool = pool or WorkerPool()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="simlib-grade-") as work:
            run = _execute(nb, [e["answer"] for e in entries], timeout, kernel_name, Path(work))
        for entry in entries:
            exercise, answer_name = entry["exercise"], entry["answer"]
            rows.append(
                Row(
                    name,
                    exercise,
                    "run",
                    f"the notebook ran within {timeout:g} s without an error",
                    run["status"] == "pass",
                    run["status"],
                    hint=""
                    if run["status"] == "pass"
                    else "run the notebook top to bottom (Kernel > Restart and Run All) before submitting",
                    detail=run["error"],
                    seconds=round(run["seconds"], 3),
                )
            )
            sent = run["answers"].get(answer_name)
            if sent is None:
                rows.append(
                    Row(
                        name,
                        exercise,
                        "check",
                        f"the notebook defines `{answer_name}`",
                        False,
                        "timeout" if run["status"] == "timeout" else "error",
                        hint=f"keep the exercise's `{answer_name}` (same name) and make sure its cell runs",
                        detail=run["error"],
                    )
                )
                continue
            if isinstance(sent, str):
                rows.append(
                    Row(
                        name,
                        exercise,
                        "check",
                        f"`{answer_name}` can be sent to the grader",
                        False,
                        "error",
                        hint="define what it needs inside the cell; it must not hold open files or clusters",
                        detail=sent,
                    )
                )
                continue
            # bytes, never unpickled here: the checks' workers open them (a load error is a failed check there)
            rows += _check_rows(name, exercise, Sent(sent), pool, check_timeout)
            rows += note_rows(name, exercise, nb)
    finally:
        if own_pool:
            pool.close()
    return rows
