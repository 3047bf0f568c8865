"""The grading journal (``<out>.rows.jsonl``, one fsynced JSON line per event): what a stopped ``simlib grade``
finished, so that a rerun skips it, and what it had started.

A line ``{"submission", "digest", "started": true}`` is written before a submission is graded and one with its
``rows`` after. A submission that was started and never finished stopped the grader while it ran (its code
killed ``simlib grade``, or the machine or a person did): on the rerun it becomes one failed row and grading
goes on with the rest, instead of running it, and being killed by it, again. Ctrl-C writes ``"interrupted"``:
that submission is graded again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path


def journal_path(out) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".rows.jsonl")


def digest(path: Path) -> str:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def read(journal: Path, row_type) -> tuple[dict, set]:
    """``({(submission, digest): [Row]}`` of the finished submissions, ``{(submission, digest)}`` of those started
    and never finished nor interrupted)."""
    done: dict = {}
    started: set = set()
    if not journal.exists():
        return done, started
    from .class_report import FIELDS

    for line in journal.read_text().splitlines():
        try:
            entry = json.loads(line)
            key = (entry["submission"], entry["digest"])
            if entry.get("started"):
                started.add(key)
            elif entry.get("interrupted"):
                started.discard(key)
            else:
                done[key] = [row_type(**{k: r[k] for k in FIELDS}) for r in entry["rows"]]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short when the grader was killed: that submission is graded again
    return done, started - set(done)


def append(journal: Path, submission: str, digest: str, rows=None, **event) -> None:
    """One event (``started=True``, ``interrupted=True``) or a submission's rows, fsynced before it returns."""
    journal.parent.mkdir(parents=True, exist_ok=True)
    entry = {"submission": submission, "digest": digest, **event}
    if rows is not None:
        entry["rows"] = [asdict(r) for r in rows]
    with open(journal, "a") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def stopped_row(row_type, submission: str):
    """The failed row of a submission during which an earlier grader stopped."""
    return row_type(
        submission,
        "?",
        "run",
        "grading finished (the grader was not stopped while it ran)",
        False,
        "error",
        hint="the grader stopped while this notebook ran, on an earlier run: its code may "
        "end `simlib grade` itself (a kill of its parent, os._exit in the wrong process). If the "
        "grader was stopped for another reason, delete this submission's lines from the journal "
        "(<out>.rows.jsonl) to grade it again",
        detail="started, never finished: not run again so that it cannot stop this run too",
    )
