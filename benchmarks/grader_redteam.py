"""Red-team the exercise grader: grade hand-written wrong answers (and the solutions) the way a learner does.

Each wrong answer is a file in ``benchmarks/redteam/`` named ``<exercise>__<slug>.py``, opening with three comment
lines (``# exercise:``, ``# kind: honest|fool``, ``# mistake: ...``) and binding the answer to ``ANSWER``. They were
written without reading the grader's checks (issue 33's reviewer). Every answer is graded in a fresh Python process,
as a notebook would: its source runs in ``__main__`` (so functions travel by value, like a cell's), then
``grading.check(exercise, ANSWER)``; the process is killed (its whole process group) after ``--timeout`` seconds.

Verdicts: ``caught`` (the grader reported a failure), ``escaped`` (the grader reported a pass), ``no_verdict`` (the
process died or ran out of time before the grader reported: not counted as caught). Solutions (extracted from
``solutions/*.ipynb``: every code cell before the check cell) must be ``passed``.

    python benchmarks/grader_redteam.py                 # every answer, then every solution
    python benchmarks/grader_redteam.py --only ring     # answers/solutions whose exercise or file contains "ring"
    python benchmarks/grader_redteam.py --no-solutions --jobs 2 --timeout 240
    python benchmarks/grader_redteam.py --skip-done                 # resume: grade only what has no verdict yet

Writes ``benchmarks/results/grader_redteam.json`` after every graded answer (a run with ``--only`` updates the
entries it grades and keeps the others); the catch rate counts the answers present in the file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "benchmarks" / "redteam"
SOLUTIONS = ROOT / "solutions"
OUT = ROOT / "benchmarks" / "results" / "grader_redteam.json"
MARK = "REDTEAM_REPORT "


def answers() -> list[dict]:
    """The wrong answers, with their declared exercise, kind and mistake."""
    found = []
    for path in sorted(ANSWERS.glob("*__*.py")):
        head = {}
        for line in path.read_text().splitlines()[:3]:
            key, _, value = line.lstrip("# ").partition(":")
            head[key.strip()] = value.strip()
        if head.get("kind") not in ("honest", "fool") or not head.get("exercise") or not head.get("mistake"):
            raise SystemExit(
                f"{path.name}: the first three lines must be '# exercise:', '# kind: honest|fool', '# mistake: ...'"
            )
        found.append(
            {
                "id": path.stem,
                "exercise": head["exercise"],
                "kind": head["kind"],
                "mistake": head["mistake"],
                "source": str(path.relative_to(ROOT)),
                "variable": "ANSWER",
            }
        )
    by_exercise = {}
    for item in found:
        by_exercise.setdefault(item["exercise"], []).append(item)
    rounds = max(len(v) for v in by_exercise.values()) if by_exercise else 0
    return [v[i] for i in range(rounds) for v in by_exercise.values() if i < len(v)]  # round-robin over exercises


def solutions() -> list[dict]:
    """Each solution notebook as Python source: its code cells before the check cell."""
    found = []
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        meta = nb.get("metadata", {}).get("simlib", {})
        for m in meta if isinstance(meta, list) else [meta]:
            code = []
            for cell in nb["cells"]:
                src = "".join(cell["source"])
                if cell["cell_type"] != "code":
                    continue
                if "grading.check(" in src:
                    break
                code.append(src)
            found.append(
                {
                    "id": f"solution:{path.stem}:{m['exercise']}",
                    "exercise": m["exercise"],
                    "kind": "solution",
                    "mistake": "",
                    "source": str(path.relative_to(ROOT)),
                    "code": "\n\n".join(code),
                    "variable": m["answer"],
                }
            )
    return found


def child(source_file: str, exercise: str, variable: str) -> None:
    """In a fresh process: run the answer's source as __main__, grade it, print one JSON line."""
    import __main__

    if source_file.endswith(".ipynb"):
        code = next(s["code"] for s in solutions() if s["source"] == source_file and s["exercise"] == exercise)
    else:
        code = (ROOT / source_file).read_text()
    exec(compile(code, source_file, "exec"), __main__.__dict__)
    from simlib import grading

    report = grading.check(exercise, __main__.__dict__[variable])

    def value(x):
        return x() if callable(x) else x

    results = list(value(getattr(report, "results", [])) or [])
    flags = [value(getattr(r, "passed", getattr(r, "ok", None))) for r in results]
    failed = [str(getattr(r, "name", getattr(r, "check", r)))[:200] for r, ok in zip(results, flags) if ok is False]
    print(
        MARK
        + json.dumps(
            {
                "status": str(value(report.status)),
                "checks": len(results),
                "failed": len(failed),
                "failed_checks": failed[:10],
            },
            default=str,
        ),
        flush=True,
    )
    grading.close()


def grade(item: dict, timeout: float) -> dict:
    """Grade one answer in its own process group; kill the group on timeout."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", item["source"], item["exercise"], item["variable"]]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        how = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        how = f"killed after {timeout:.0f} s"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # any worker the grader left behind
    except ProcessLookupError:
        pass
    seconds = round(time.monotonic() - start, 1)
    reports = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    row = {k: item[k] for k in ("id", "exercise", "kind", "mistake", "source")}
    row.update(seconds=seconds, process=how)
    if not reports:
        row.update(verdict="no_verdict", tail=out[-1500:])
    else:
        rep = reports[-1]
        passed = rep["status"] == "pass"
        if item["kind"] == "solution":
            row["verdict"] = "passed" if passed else "failed"
        else:
            row["verdict"] = "escaped" if passed else "caught"
        row.update(report=rep)
        if not passed or item["kind"] == "solution":
            row["tail"] = out[-800:] if not passed else ""
    return row


def evidence() -> dict:
    """For the exercises that need no processes, an instance on which each wrong answer differs from the solution."""
    import random

    sol = {s["exercise"]: s for s in solutions()}
    found = {}
    for item in answers():
        if item["exercise"] not in ("one_f_one_b", "checkpoint_placement"):
            continue
        ref_ns, ans_ns = {}, {}
        code = sol[item["exercise"]]["code"]
        code = "\n".join(
            line for line in code.splitlines() if "checkpoint_problem" not in line and not line.startswith("print")
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the solution's demo prints
            exec(code, ref_ns)
        exec((ROOT / item["source"]).read_text(), ans_ns)
        ref, ans, rng = ref_ns[sol[item["exercise"]]["variable"]], ans_ns["ANSWER"], random.Random(0)
        for _ in range(2000):
            if item["exercise"] == "one_f_one_b":
                p = rng.randint(1, 4)
                args = (rng.randrange(p), p, rng.randint(1, 8))
                got, want = ans(*args), ref(*args)
            else:
                n = rng.randint(2, 6)
                act = [rng.randint(10, 100) for _ in range(n)]
                inp = [rng.randint(1, a) for a in act]
                flops = [rng.randint(1, 100) for _ in range(n)]
                args = (act, inp, flops, rng.randint(sum(inp), sum(act)))
                got, want = ans(*args), ref(*args)
                cost = lambda c: (
                    sum(flops[i] for i in c),
                    sum(inp[i] if i in c else act[i] for i in range(n)) <= args[3],
                )
                got, want = cost(got), cost(want)  # equal cost and fit = an equally good answer
            if got != want:
                found[item["id"]] = {"args": repr(args), "answer": repr(got), "solution": repr(want)}
                break
        else:
            found[item["id"]] = None
    return found


def summarise(rows: dict) -> dict:
    wrong = [r for r in rows.values() if r["kind"] != "solution"]
    sols = [r for r in rows.values() if r["kind"] == "solution"]
    per = {}
    for r in wrong:
        e = per.setdefault(r["exercise"], {"answers": 0, "caught": 0, "escaped": [], "no_verdict": []})
        e["answers"] += 1
        e["caught"] += r["verdict"] == "caught"
        if r["verdict"] in ("escaped", "no_verdict"):
            e[r["verdict"]].append(r["id"])
    for e in per.values():
        e["catch_rate"] = round(e["caught"] / e["answers"], 3)
    by_kind = {}
    for kind in ("honest", "fool"):
        ks = [r for r in wrong if r["kind"] == kind]
        by_kind[kind] = {"answers": len(ks), "caught": sum(r["verdict"] == "caught" for r in ks)}
    caught = sum(r["verdict"] == "caught" for r in wrong)
    return {
        "answers_graded": len(wrong),
        "caught": caught,
        "escaped": sorted(r["id"] for r in wrong if r["verdict"] == "escaped"),
        "no_verdict": sorted(r["id"] for r in wrong if r["verdict"] == "no_verdict"),
        "catch_rate": round(caught / len(wrong), 3) if wrong else None,
        "by_kind": by_kind,
        "per_exercise": dict(sorted(per.items())),
        "solutions_graded": len(sols),
        "solutions_passed": sum(r["verdict"] == "passed" for r in sols),
        "solutions_not_passed": sorted(r["id"] for r in sols if r["verdict"] != "passed"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", help="grade only answers/solutions whose exercise or id contains this (several: comma-separated)"
    )
    ap.add_argument(
        "--skip-done",
        action="store_true",
        help="skip what the results file already holds a verdict for (resume a stopped run)",
    )
    ap.add_argument("--no-solutions", action="store_true", help="skip the solutions")
    ap.add_argument("--solutions-only", action="store_true", help="grade only the solutions")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per answer (default 240)")
    ap.add_argument("--jobs", type=int, default=2, help="answers graded at once (default 2)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    items = [] if args.solutions_only else answers()
    if not args.no_solutions:
        items += solutions()
    if args.only:
        wanted = args.only.split(",")
        items = [i for i in items if any(w in i["exercise"] or w in i["id"] for w in wanted)]
    rows = json.loads(OUT.read_text()).get("rows", {}) if OUT.exists() else {}
    if args.skip_done:
        items = [i for i in items if rows.get(i["id"], {}).get("verdict", "no_verdict") == "no_verdict"]
    known = {i["id"] for i in answers()} | {i["id"] for i in solutions()}
    rows = {k: v for k, v in rows.items() if k in known}  # drop answers since removed
    proof = evidence()
    print(f"grading {len(items)} answers/solutions, {args.jobs} at a time, {args.timeout:.0f} s each", flush=True)

    def write():
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(
            json.dumps(
                {
                    "what": "grader red team (issue 33): hand-written wrong answers graded through "
                    "grading.check in a fresh process each",
                    "timeout_s": args.timeout,
                    "summary": summarise(rows),
                    "evidence": {
                        "what": "an instance where the answer differs from the solution "
                        "(exercises that need no processes)",
                        "found": proof,
                    },
                    "rows": dict(sorted(rows.items())),
                },
                indent=1,
            )
            + "\n"
        )

    def one(item):
        row = grade(item, args.timeout)
        rows[item["id"]] = row
        write()
        print(f"{row['verdict']:>10}  {row['seconds']:6.1f} s  {item['id']}", flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, items))
    write()
    s = summarise(rows)
    print(
        f"caught {s['caught']} of {s['answers_graded']} wrong answers ({s['catch_rate']}); "
        f"escaped: {s['escaped']}; no verdict: {s['no_verdict']}; "
        f"solutions passed {s['solutions_passed']} of {s['solutions_graded']}"
    )


if __name__ == "__main__":
    main()
