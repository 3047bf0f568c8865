"""The class report of ``simlib grade``: per-exercise summary, CSV and JSON files, the table it prints.

Rows are :class:`simlib.grading.batch.Row` (one per submission and check); :mod:`simlib.grading.batch` re-exports
everything here.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

FIELDS = ["submission", "exercise", "kind", "check", "passed", "status", "hint", "detail", "seconds"]


def summarize(rows) -> list[dict]:
    """Per exercise: submissions, how many passed every check, not implemented, errors or time-outs, and the
    pass rate of each check."""
    by_exercise: dict = {}
    for r in rows:
        by_exercise.setdefault(r.exercise, {}).setdefault(r.submission, []).append(r)
    summary = []
    for exercise, subs in sorted(by_exercise.items()):
        checks: dict = {}
        for rs in subs.values():
            for r in rs:
                if r.kind == "check":
                    checks.setdefault(r.check, []).append(r.passed)

        def status(rs):
            graded = [r for r in rs if r.kind == "check"]
            if graded and all(r.passed for r in graded):
                return "pass"
            return next(
                (
                    s
                    for s in ("not implemented", "timeout", "error", "fail")
                    if any(r.status == s for r in rs if not r.passed)
                ),
                "fail",
            )

        outcomes = [status(rs) for rs in subs.values()]
        summary.append(
            dict(
                exercise=exercise,
                submissions=len(subs),
                passed=outcomes.count("pass"),
                failed=outcomes.count("fail"),
                not_implemented=outcomes.count("not implemented"),
                errors=outcomes.count("error"),
                timeouts=outcomes.count("timeout"),
                check_pass_rate={name: round(sum(v) / len(v), 3) for name, v in checks.items()},
            )
        )
    return summary


def write(rows, out: Path | str) -> dict:
    """Write ``out`` (CSV, one row per submission and check), ``out`` with ``.json`` (rows and summary) and
    ``<stem>_summary.csv``; returns the paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = [asdict(r) for r in rows]
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(data)
    summary = summarize(rows)
    json_path = out.with_suffix(".json")
    json_path.write_text(json.dumps({"rows": data, "summary": summary}, indent=2, ensure_ascii=False))
    summary_path = out.with_name(out.stem + "_summary.csv")
    with open(summary_path, "w", newline="") as f:
        cols = ["exercise", "submissions", "passed", "failed", "not_implemented", "errors", "timeouts"]
        writer = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(summary)
    return dict(csv=out, json=json_path, summary=summary_path)


def format_summary(rows) -> str:
    lines = [
        f"{'exercise':<22} {'submissions':>11} {'passed':>6} {'failed':>6} {'todo':>4} {'error':>5} {'timeout':>7}"
    ]
    for s in summarize(rows):
        lines.append(
            f"{s['exercise']:<22} {s['submissions']:>11} {s['passed']:>6} {s['failed']:>6} "
            f"{s['not_implemented']:>4} {s['errors']:>5} {s['timeouts']:>7}"
        )
    return "\n".join(lines)
