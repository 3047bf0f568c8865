"""Grading a class: ``simlib grade SUBMISSIONS... [--out grades.csv]``.

Each submission is graded in a child process of its own (``python -m simlib.grading.batch``), started in a new
Unix session, with a fresh temporary working directory that holds only a copy of its notebook. In that child,
the notebook runs in its own Jupyter kernel (nbclient) under a time limit; the notebook's own check calls do not
count (``grading.check`` and ``grading.close`` are no-ops in that kernel, whatever it prints is ignored); after
the last cell the kernel sends back, by value (cloudpickle bytes), the objects the exercise grades - named by
the course's own ``solutions/`` notebook, not by the submission's copy - and the child runs the library's checks
with worker processes of its own. The child never unpickles those bytes (it reads the kernel's file with an
unpickler that builds no class): it hands them to its workers as bytes (:class:`simlib.grading.core.Sent`), the
learner's code runs only there, and what comes back is plain data of exact types (``Cluster.call(plain=True)``).
So an answer's ``__reduce__``, constructor, properties or methods never run where the verdict is computed. The
child signs its JSON rows with a key the grader gave it on its standard input (before the kernel started; the
child is made non-dumpable, so a process of the same user cannot read its memory), and the grader refuses rows
without that signature: a submission that writes rows for itself gets a failed row. When the child ends (or its
time is up)
every process of the submission is killed: its cgroup (made for it where the grader may: root, no systemd needed;
a process cannot leave it by a new session or a cleared environment), the child's session and process group, and
every process that carries the submission's token in its environment. A child
whose grader dies does that itself (``--parent``: :func:`simlib.grading.isolation.end_with_parent`).

Rows are appended to a journal (``<out>.rows.jsonl``, fsynced) as each submission finishes; a grader that is
stopped and started again with the same ``--out`` skips the submissions already in it (same path, same bytes),
and turns one that was started and never finished (it stopped the grader) into a failed row
(:mod:`simlib.grading.journal`).

``sandbox="unshare"`` (``simlib grade --sandbox unshare``, Linux with unprivileged user namespaces) runs each
child in new user, mount and network namespaces: no network but loopback, the course folder mounted read-only,
and the submitted folders hidden behind an empty tmpfs. Without it a submission can still read files the
grader's user can read, write where that user can write, and use the network; run untrusted classes with it or
in a container. What the OS still allows without it: a kernel running as root (or able to ptrace the child) can
read the child's key; only the sandbox or a container stops that.

Output: one row per submission and check — ``submission, exercise, kind, check, passed, status, hint, detail,
seconds`` (``kind`` is "run" for the notebook's own run, "check" for a library check) — as CSV and JSON, and a
per-exercise summary (``summarize``), also written beside the CSV (``<stem>_summary.csv``) and into the JSON.
"""
from __future__ import annotations

import hmac
import io
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["grade", "grade_notebook", "sandbox_available", "journal_path", "find_submissions", "summarize", "write", "Row", "WorkerPool"]

from .class_report import FIELDS, format_summary, summarize, write  # noqa: F401 - the class report, re-exported
from .core import Sent
from . import journal as _journal
from .isolation import (_CGROUP, _TOKEN, _kill_submission, _mac, _not_dumpable, _sandboxed, end_with_parent,  # noqa: F401
                        join_cgroup, new_cgroup, remove_cgroup, remove_stale_cgroups, sandbox_available)
from .journal import journal_path  # noqa: F401 - where `simlib grade --out` journals

# Runs first in the learner's kernel: the notebook's own checks become no-ops (the grader runs them itself).
_PREAMBLE = '''
import simlib.grading as _simlib_grading
def _simlib_skipped_check(name, answer=None, *args, **kwargs):
    print(f"(grading.check({name!r}) not run here: `simlib grade` runs the checks itself)")
    return _simlib_grading.Report(str(name))
_simlib_grading.check = _simlib_skipped_check
_simlib_grading.close = lambda *args, **kwargs: None
del _simlib_skipped_check
'''

# Runs last: the graded objects, by value, into a file only the grader knows.
_EXPORT = '''
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
'''


@dataclass
class Row:
    submission: str
    exercise: str
    kind: str        # "run": the notebook's own run; "check": one of the library's checks
    check: str
    passed: bool
    status: str      # pass | fail | not implemented | error | timeout
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

    candidates = sorted((p for p in solutions.glob("[0-9]*.ipynb") if path.name.endswith(p.name)),
                        key=lambda p: -len(p.name))
    if candidates:
        return exercises_of(nbformat.read(str(candidates[0]), as_version=4))
    try:
        entries = exercises_of(nb)
    except Exception:  # noqa: BLE001 - malformed metadata
        return []
    return [e for e in entries if isinstance(e, dict) and e.get("exercise") in grading.EXERCISES
            and isinstance(e.get("answer"), str)]


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
    client = NotebookClient(run, timeout=max(1, int(timeout)), kernel_name=kernel_name, allow_errors=True,
                            interrupt_on_timeout=True, startup_timeout=120, extra_arguments=["--log-level=ERROR"],
                            resources={"metadata": {"path": str(workdir)}})
    result = dict(answers={}, error="", status="pass", seconds=0.0)
    t0 = time.monotonic()
    try:
        with client.setup_kernel():
            client.timeout = 120  # the grader's own preparation (it imports simlib): not the learner's time
            client.execute_cell(run.cells[0], 0)
            failed = next((o for o in run.cells[0].get("outputs", []) if o.get("output_type") == "error"), None)
            if failed is not None:
                raise RuntimeError(f"the grader could not prepare the kernel (is simlib installed for it?): "
                                   f"{failed.get('ename')}: {failed.get('evalue')}")
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
                    result.update(status="timeout", error=f"the notebook did not finish within {timeout:g} s "
                                                          f"(stopped in code cell {index}: {_first_line(cell)})")
                    break
                error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
                if error is not None and not result["error"]:
                    result.update(status="error", error=f"code cell {index} ({_first_line(cell)}): "
                                                        f"{error.get('ename')}: {error.get('evalue')}")
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
            if type(answers) is not dict or not all(type(k) is str and type(v) in (bytes, str)
                                                    for k, v in answers.items()):
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
        return [Row(name, exercise, "check", "the checks ran", False, "error", detail=f"{type(exc).__name__}: {exc}",
                    seconds=time.monotonic() - t0)]
    results = list(report.results)
    if len(clock.times) == len(results):
        ends = clock.times
    else:  # lines and results do not pair up: share the time out evenly
        total = time.monotonic() - t0
        ends = [t0 + total * (i + 1) / max(1, len(results)) for i in range(len(results))]
    starts = [t0] + ends[:-1]
    return [Row(name, exercise, "check", r.name, bool(r.passed), r.status, "" if r.passed else r.hint, r.detail,
                round(end - start, 3)) for r, start, end in zip(results, starts, ends)]


def grade_notebook(path, timeout: float = 300.0, pool: WorkerPool | None = None, check_timeout: float = 30.0,
                   solutions: Path | str | None = None, kernel_name: str = "python3") -> list[Row]:
    """Grade one submitted notebook; returns its rows. Never raises for anything the submission does."""
    import nbformat

    path = Path(path)
    name = str(path)
    solutions = Path(solutions) if solutions else _course_root() / "solutions"
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unreadable
        return [Row(name, "?", "run", "the submission is a notebook", False, "error",
                    hint="submit the exercise's .ipynb file as saved by Jupyter", detail=f"{type(exc).__name__}: {exc}")]
    entries = _official_entries(path, nb, solutions)
    if not entries:
        known = ", ".join(sorted(p.name for p in solutions.glob("[0-9]*.ipynb")))
        return [Row(name, "?", "run", "the submission names a known exercise", False, "error",
                    hint=f"keep the exercise's file name (one of: {known})")]
    own_pool = pool is None
    pool = pool or WorkerPool()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="simlib-grade-") as work:
            run = _execute(nb, [e["answer"] for e in entries], timeout, kernel_name, Path(work))
        for entry in entries:
            exercise, answer_name = entry["exercise"], entry["answer"]
            rows.append(Row(name, exercise, "run", f"the notebook ran within {timeout:g} s without an error",
                            run["status"] == "pass", run["status"],
                            hint="" if run["status"] == "pass" else
                            "run the notebook top to bottom (Kernel > Restart and Run All) before submitting",
                            detail=run["error"], seconds=round(run["seconds"], 3)))
            sent = run["answers"].get(answer_name)
            if sent is None:
                rows.append(Row(name, exercise, "check", f"the notebook defines `{answer_name}`", False,
                                "timeout" if run["status"] == "timeout" else "error",
                                hint=f"keep the exercise's `{answer_name}` (same name) and make sure its cell runs",
                                detail=run["error"]))
                continue
            if isinstance(sent, str):
                rows.append(Row(name, exercise, "check", f"`{answer_name}` can be sent to the grader", False, "error",
                                hint="define what it needs inside the cell; it must not hold open files or "
                                     "clusters", detail=sent))
                continue
            # bytes, never unpickled here: the checks' workers open them (a load error is a failed check there)
            rows += _check_rows(name, exercise, Sent(sent), pool, check_timeout)
    finally:
        if own_pool:
            pool.close()
    return rows


def find_submissions(paths) -> list[Path]:
    """Notebooks among ``paths`` (files as given; folders searched recursively, checkpoints skipped)."""
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.exists():
            found.append(p)
        else:
            raise ValueError(f"{p}: no such file or folder")
    return found


def _child_start(cgroup, parent: int):
    """What a grading child does between fork and exec: join the submission's cgroup, die with the grader."""
    from .isolation import die_with_parent

    def start():
        if cgroup:
            join_cgroup(cgroup)
        die_with_parent(parent)
    return start


def _grade_in_child(path: Path, timeout: float, check_timeout: float, solutions, kernel_name: str,
                    sandbox: str | None = None, hide=()) -> list[Row]:
    """Grade one submission in a fresh child process (own session, own working directory holding only a copy
    of the notebook); read back plain JSON rows; kill every process of the submission at the end."""
    name = str(path)
    token = secrets.token_hex(12)
    cgroup = new_cgroup(token)  # every process of the submission is born in it (None: none can be made here)
    work = Path(tempfile.mkdtemp(prefix="simlib-grade-"))
    try:
        copy = work / path.name
        try:
            copy.write_bytes(path.read_bytes())
        except OSError as exc:
            return [Row(name, "?", "run", "the submission can be read", False, "error", detail=str(exc))]
        out = work / f"rows-{token}.json"
        command = [sys.executable, "-m", "simlib.grading.batch", "--one", str(copy), "--name", name,
                   "--rows", str(out), "--timeout", str(timeout), "--check-timeout", str(check_timeout),
                   "--kernel", kernel_name, "--parent", str(os.getpid())]
        command += ["--solutions", str(solutions)] if solutions else []
        if sandbox == "unshare":
            command = _sandboxed(command, list(hide), work, _course_root())
        elif sandbox:
            raise ValueError(f"unknown sandbox {sandbox!r}: use 'unshare' or none")
        env = {**os.environ, _TOKEN: token, **({_CGROUP: str(cgroup)} if cgroup else {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_course_root()), env.get("PYTHONPATH", "")) if p)
        # the notebook's run, its export and every check, with room for kernel start-up and worker launches
        limit = timeout + 180 + 20 * check_timeout
        key = secrets.token_bytes(32)  # signs the child's rows: given on its stdin, read before the kernel starts
        t0 = time.monotonic()
        child = subprocess.Popen(command, cwd=work, env=env, start_new_session=True, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 preexec_fn=_child_start(cgroup, os.getpid()))
        try:
            log, _ = child.communicate(input=key.hex().encode() + b"\n", timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_submission(child, token, cgroup)
            log = b""
            return [Row(name, "?", "run", f"grading finished within {limit:g} s", False, "timeout",
                        detail="the submission's grading process was stopped", seconds=time.monotonic() - t0)]
        finally:
            _kill_submission(child, token, cgroup)
        try:
            signed = json.loads(out.read_text())
            mac = _mac(key, signed.get("rows")) if type(signed) is dict else None
            if mac is None or not hmac.compare_digest(str(signed.get("mac")), mac):
                raise ValueError("rows not signed by the grading process (written by the submission?)")
            rows = [Row(**{k: r[k] for k in FIELDS}) for r in json.loads(signed["rows"])]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            tail = log.decode(errors="replace").strip().splitlines()[-3:]
            return [Row(name, "?", "run", "the grading process reported its rows", False, "error",
                        hint="the submission's code ended the process that grades it or wrote rows for itself "
                             "(or the grader failed)",
                        detail=(f"exit {child.returncode}; {type(exc).__name__}: {exc}; " + " | ".join(tail))[:500],
                        seconds=round(time.monotonic() - t0, 3))]
        return rows
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
        if cgroup:
            remove_cgroup(cgroup)


def grade(submissions, timeout: float = 300.0, check_timeout: float = 30.0, reuse: bool = False,
          clusters: dict | None = None, solutions=None, kernel_name: str = "python3", progress=None,
          journal=None, sandbox: str | None = None) -> list[Row]:
    """Grade every submission (files or folders of ``.ipynb``), each in a child process of its own; returns all
    rows.

    ``timeout``: seconds each notebook may run in its kernel; ``check_timeout``: seconds each multi-process
    check may take; ``journal``: a file the rows are appended to as each submission finishes (fsynced); the
    submissions already in it are not graded again (resume). ``sandbox``: None or "unshare" (see the module
    docstring). ``progress(text)`` is told each submission's outcome (default: print to stderr).
    ``reuse`` and ``clusters`` share worker processes between submissions in this process: trusted classes and
    tests only - the answers are still opened only in the workers, but one submission's code can change the
    workers that grade the next, and the kernels run under this process.
    """
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    paths = find_submissions(submissions)
    trusted = reuse or clusters
    shared = WorkerPool(clusters) if trusted else None
    journal = Path(journal) if journal else None
    done, started = _journal.read(journal, Row) if journal else ({}, set())
    hide = sorted({Path(p) if Path(p).is_dir() else Path(p).parent for p in submissions})
    remove_stale_cgroups()
    rows = []
    try:
        for i, path in enumerate(paths, 1):
            t0 = time.monotonic()
            digest = _journal.digest(path)
            if (str(path), digest) in done:
                mine = done[(str(path), digest)]
                say(f"[{i}/{len(paths)}] {path}: graded before (journal), skipped")
            elif (str(path), digest) in started:
                mine = [_journal.stopped_row(Row, str(path))]
                _journal.append(journal, str(path), digest, mine)
                say(f"[{i}/{len(paths)}] {path}: the grader stopped while it ran before: a failed row, not run again")
            else:
                if journal:
                    _journal.append(journal, str(path), digest, started=True)
                try:
                    mine = (grade_notebook(path, timeout, shared, check_timeout, solutions, kernel_name) if trusted
                            else _grade_in_child(path, timeout, check_timeout, solutions, kernel_name, sandbox, hide))
                except KeyboardInterrupt:  # the instructor's Ctrl-C: grade it again next time
                    if journal:
                        _journal.append(journal, str(path), digest, interrupted=True)
                    raise
                if journal:
                    _journal.append(journal, str(path), digest, mine)
                checks = [r for r in mine if r.kind == "check"]
                say(f"[{i}/{len(paths)}] {path}: {sum(r.passed for r in checks)}/{len(checks)} checks passed "
                    f"({time.monotonic() - t0:.0f} s)")
            rows += mine
    finally:
        if shared is not None:
            shared.close()
    return rows


def _child_main(argv=None) -> int:
    """The child of :func:`_grade_in_child`: grade one notebook, write its rows as JSON (plain data only), signed
    with the key read from stdin before the learner's kernel starts."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m simlib.grading.batch")
    parser.add_argument("--one", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--check-timeout", type=float, default=30.0)
    parser.add_argument("--kernel", default="python3")
    parser.add_argument("--solutions", default=None)
    parser.add_argument("--parent", type=int, default=None, help="the grader's pid: end with it")
    args = parser.parse_args(argv)
    if args.parent:  # first: from here on the watch, not the kernel's SIGKILL, ends this child with its grader
        end_with_parent(args.parent)
    _not_dumpable()
    key = bytes.fromhex(sys.stdin.readline().strip())
    sys.stdin.close()
    rows = grade_notebook(args.one, args.timeout, None, args.check_timeout, args.solutions, args.kernel)
    for r in rows:
        r.submission = args.name
    text = json.dumps([asdict(r) for r in rows], ensure_ascii=False, default=str)
    data = json.dumps({"rows": text, "mac": _mac(key, text)})
    with open(args.rows, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
