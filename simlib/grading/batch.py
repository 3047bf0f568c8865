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

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import journal as _journal
from .child import grade_in_child as _grade_in_child
from .class_report import FIELDS, format_summary, summarize, write  # noqa: F401 - the class report, re-exported
from .isolation import _mac, _not_dumpable, end_with_parent, remove_stale_cgroups, sandbox_available  # noqa: F401
from .journal import journal_path  # noqa: F401 - where `simlib grade --out` journals
from .notebook_run import Row, WorkerPool, _execute, grade_notebook  # noqa: F401 - re-exported for the tests

__all__ = [
    "grade",
    "grade_notebook",
    "sandbox_available",
    "journal_path",
    "find_submissions",
    "summarize",
    "write",
    "Row",
    "WorkerPool",
]


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


def grade(
    submissions,
    timeout: float = 300.0,
    check_timeout: float = 30.0,
    reuse: bool = False,
    clusters: dict | None = None,
    solutions=None,
    kernel_name: str = "python3",
    progress=None,
    journal=None,
    sandbox: str | None = None,
) -> list[Row]:
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
                    mine = (
                        grade_notebook(path, timeout, shared, check_timeout, solutions, kernel_name)
                        if trusted
                        else _grade_in_child(path, timeout, check_timeout, solutions, kernel_name, sandbox, hide)
                    )
                except KeyboardInterrupt:  # the instructor's Ctrl-C: grade it again next time
                    if journal:
                        _journal.append(journal, str(path), digest, interrupted=True)
                    raise
                if journal:
                    _journal.append(journal, str(path), digest, mine)
                checks = [r for r in mine if r.kind == "check"]
                say(
                    f"[{i}/{len(paths)}] {path}: {sum(r.passed for r in checks)}/{len(checks)} checks passed "
                    f"({time.monotonic() - t0:.0f} s)"
                )
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
