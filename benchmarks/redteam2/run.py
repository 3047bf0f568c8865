"""Grade the red team's wrong answers (and each exercise's solution) through ``grading.check``, as a learner would.

    cd /work/wt-red && nice -n 10 env PYTHONPATH=$PWD SIMLIB_QUICK=1 .venv/bin/python benchmarks/redteam2/run.py
    ... run.py --only ring_all_reduce,plan_memory     # some exercises (rows of the others are kept)
    ... run.py --answers lse_starts_at_zero            # some answers (and their exercises' solutions)
    ... run.py --readme                                 # only rewrite README.md's results from the JSON

Each exercise's solution and honest answers are graded one after the other in one fresh process (warm workers, as
in one notebook session; the solution first); every deliberate answer in a fresh process of its own, since it may
patch what it finds. A process that shows no progress for ``--hang`` seconds (default 330: a hang over 5 minutes is
a finding) is stopped, its answer recorded as a hang, and the rest of its group graded in a new process. Writes
``benchmarks/results/grader_redteam2.json`` and the results section of this folder's README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = Path(os.environ.get("RT2_RESULTS", ROOT / "benchmarks" / "results" / "grader_redteam2.json"))
MODULES = [
    "ring_all_reduce",
    "average_gradients",
    "bucket_data_parallel",
    "accumulate_no_sync",
    "one_f_one_b",
    "pipeline_stage",
    "tp_linear",
    "checkpoint_placement",
    "sharded_optimizer",
    "zero3_linear",
    "full_state",
    "ring_attention",
    "moe_dispatch",
    "zero3_prefetch",
    "plan_memory",
]
SOLUTION = "solution"


# ── loading what is graded ──────────────────────────────────────────────────────────────────────────────────────
def load_module(name: str):
    import cloudpickle

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    module = importlib.import_module(name)
    for m in (module, importlib.import_module("_common")):
        cloudpickle.register_pickle_by_value(m)  # the answers travel by value, as a notebook cell's code does
    return module


def answers_in(name: str) -> list[dict]:
    """[{exercise, name, kind, doc}] of one module, the solution first."""
    module = load_module(name)
    from _common import answers_of  # sys.path set by load_module

    rows = [
        {
            "module": name,
            "exercise": module.EXERCISE,
            "name": SOLUTION,
            "kind": SOLUTION,
            "doc": f"the course's solution, solutions/{module.NOTEBOOK}.ipynb",
        }
    ]
    for factory in answers_of(module):
        rows.append(
            {
                "module": name,
                "exercise": module.EXERCISE,
                "name": factory.__name__,
                "kind": factory.kind,
                "doc": factory.__doc__.strip(),
            }
        )
    return rows


def solution_answer(notebook: str):
    """Run the solution notebook's code cells (not the grading ones) in a fresh namespace, as a kernel would."""
    nb = json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text())
    namespace = {"__name__": "rt2_solution_" + notebook}  # not importable: its functions travel by value
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and "grading." not in src:
            exec(compile(src, f"<{notebook}>", "exec"), namespace)
    return namespace[nb["metadata"]["simlib"]["answer"]]


def graded_object(row: dict):
    module = load_module(row["module"])
    if row["name"] == SOLUTION:
        return solution_answer(module.NOTEBOOK)
    return getattr(module, row["name"])()


# ── the worker: grade a list of answers, one JSON line each ──────────────────────────────────────────────────────
def summarize(report) -> tuple[str, str, str]:
    failed = [r for r in report.results if not r.passed]
    if not failed:
        return "pass", "", ""
    first = failed[0]
    status = first.status or "fail"
    hint = f"{first.name}: {first.hint}".strip()
    return status, hint[:600], "; ".join(f"{r.name} [{r.status or 'fail'}]" for r in failed)[:600]


def worker(rows: list[dict], out: Path) -> None:
    built = {}
    for row in rows:  # as in a notebook: the answer's cells run before the check cell imports the grader
        try:
            built[row["name"]] = graded_object(row)
        except Exception as exc:
            built[row["name"]] = exc
    from simlib import grading

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    with out.open("a") as f:

        def emit(d):
            f.write(json.dumps(d) + "\n")
            f.flush()

        try:
            for row in rows:
                emit({"start": row["name"], "t": time.time()})
                t0 = time.perf_counter()
                rec = dict(row)
                watch_log = Path("/tmp/rt2_watched.log")  # what detect-the-measurement answers saw, per call
                watch_from = watch_log.stat().st_size if watch_log.exists() else 0
                try:
                    answer = built[row["name"]]
                    if isinstance(answer, Exception):
                        raise answer
                    report = grading.check(row["exercise"], answer)
                    rec["status"], rec["hint"], rec["failed_checks"] = summarize(report)
                    rec["passed"] = bool(report.passed)
                    rec["checks"] = len(report.results)
                except BaseException as exc:  # the grader raised into the "kernel": a finding of its own
                    rec.update(
                        passed=False,
                        status="grader raised",
                        hint=f"{type(exc).__name__}: {exc}"[:600],
                        failed_checks="",
                        checks=0,
                    )
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                rec["seconds"] = round(time.perf_counter() - t0, 1)
                if row["kind"] == "deliberate" and watch_log.exists() and watch_log.stat().st_size > watch_from:
                    with watch_log.open() as wl:
                        wl.seek(watch_from)
                        seen = [ln for ln in wl.read().splitlines() if row["name"] in ln]
                    rec["watched_calls"] = {
                        "watched": sum(" True" in ln or "=True" in ln for ln in seen),
                        "unwatched": sum(" False" in ln or "=False" in ln for ln in seen),
                    }
                emit({"row": rec})
        finally:
            grading.close()


# ── the orchestrator ────────────────────────────────────────────────────────────────────────────────────────────
def run_group(rows: list[dict], hang_s: float, log: Path) -> list[dict]:
    """Grade ``rows`` in one fresh process (restarted after a hang); returns their finished records."""
    done, todo = [], list(rows)
    while todo:
        out = log.with_suffix(f".{os.getpid()}.{int(time.time() * 1000)}.jsonl")
        out.write_text("")
        spec = json.dumps(todo)
        env = dict(os.environ, PYTHONPATH=str(ROOT), SIMLIB_QUICK=os.environ.get("SIMLIB_QUICK", "1"))
        with open(log, "a") as logf:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--worker", spec, str(out)],
                cwd=ROOT,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            started, current, finished, killed = time.time(), None, set(), False
            while True:
                code = proc.poll()
                for line in out.read_text().splitlines():
                    d = json.loads(line)
                    if "start" in d:
                        current, started = d["start"], d["t"]
                    elif d["row"]["name"] not in finished:
                        finished.add(d["row"]["name"])
                        done.append(d["row"])
                        print(
                            f"  {d['row']['exercise']:22s} {d['row']['name']:45s} "
                            f"{'CAUGHT' if not d['row']['passed'] else 'passed'} {d['row']['seconds']} s "
                            f"{d['row']['hint'][:90]}",
                            flush=True,
                        )
                if code is not None:
                    break
                if current not in finished and time.time() - started > hang_s:
                    killed = True
                    os.killpg(proc.pid, signal.SIGTERM)  # our own child's session only
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    break
                time.sleep(1.0)
        out.unlink(missing_ok=True)
        left = [r for r in todo if r["name"] not in finished]
        if left and current is not None and current not in finished:
            hung = next(r for r in left if r["name"] == current)
            rec = dict(
                hung,
                passed=False,
                status="hang" if killed else "grading process died",
                failed_checks="",
                checks=0,
                seconds=round(time.time() - started, 1),
                hint=f"no verdict after {hang_s:.0f} s: the driver stopped the grading process"
                if killed
                else f"the grading process exited ({proc.returncode}) during this answer; see {log.name}",
            )
            done.append(rec)
            print(f"  {rec['exercise']:22s} {rec['name']:45s} HANG {rec['seconds']} s", flush=True)
            left = [r for r in left if r["name"] != current]
        elif left:  # the process died between answers: record the next one as a crash, go on with the rest
            rec = dict(
                left[0],
                passed=False,
                status="grading process died",
                failed_checks="",
                checks=0,
                hint=f"exit code {proc.returncode}; see {log.name}",
                seconds=0.0,
            )
            done.append(rec)
            left = left[1:]
        todo = left
    return done


def path_note(r: dict) -> str:
    """For an answer that behaves only while watched: how many graded calls took its shortcut."""
    w = r.get("watched_calls")
    if not w:
        return ""
    if not w["unwatched"]:
        return (
            f" — every one of its {w['watched']} graded calls saw a measurement and took the right path: the "
            f"grader watches every call, so this pass is not a hole"
        )
    return f" — took its shortcut in {w['unwatched']} of {w['watched'] + w['unwatched']} graded calls"


def table(rows: list[dict]) -> tuple[str, list[str]]:
    """Markdown: the catch rate per exercise and overall; and the lines naming every answer that passed."""
    graded = [r for r in rows if r["kind"] != SOLUTION]
    lines = ["| exercise | answers (honest / deliberate) | caught | catch rate | solution |", "|---|---|---|---|---|"]
    for ex in dict.fromkeys(r["exercise"] for r in rows):
        mine = [r for r in graded if r["exercise"] == ex]
        sol = [r for r in rows if r["exercise"] == ex and r["kind"] == SOLUTION]
        caught = sum(not r["passed"] for r in mine)
        h = sum(r["kind"] == "honest" for r in mine)
        lines.append(
            f"| `{ex}` | {len(mine)} ({h} / {len(mine) - h}) | {caught} | "
            f"{100 * caught / max(1, len(mine)):.0f} % | {'passes' if sol and sol[0]['passed'] else 'FAILS'} |"
        )
    caught = sum(not r["passed"] for r in graded)
    for kind in ("honest", "deliberate"):
        k = [r for r in graded if r["kind"] == kind]
        lines.append(
            f"| all {kind} | {len(k)} | {sum(not r['passed'] for r in k)} | "
            f"{100 * sum(not r['passed'] for r in k) / max(1, len(k)):.0f} % | |"
        )
    lines.append(f"| **all** | {len(graded)} | {caught} | {100 * caught / max(1, len(graded)):.0f} % | |")
    holes = [
        f"- `{r['exercise']}` / `{r['name']}` ({r['kind']}, {r['seconds']} s): {r['doc']}{path_note(r)}"
        for r in graded
        if r["passed"]
    ]
    return "\n".join(lines), holes


def every_answer(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        verdict = (
            ("solution passes" if r["passed"] else "SOLUTION FAILS")
            if r["kind"] == SOLUTION
            else ("**passed**" if r["passed"] else f"caught ({r['status']})")
        )
        hint = f" — {r['hint'][:160]}" if r.get("hint") else ""
        out.append(
            f"- `{r['exercise']}` / `{r['name']}` ({r['kind']}): {verdict}, {r['seconds']} s. "
            f"{r['doc']}{path_note(r)}{hint}"
        )
    return out


def write_readme(payload: dict) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    begin, end = "<!-- results: written by run.py -->", "<!-- end of results -->"
    tab, holes = table(payload["rows"])
    slow = [
        f"- `{r['exercise']}` / `{r['name']}`: {r['status']}, {r['seconds']} s"
        for r in payload["rows"]
        if r["status"] in ("hang", "grader raised", "grading process died") or r["seconds"] > 300
    ]
    section = "\n".join(
        [
            begin,
            f"Graded {payload['when']} ({payload['note']}).",
            "",
            tab,
            "",
            "Answers the grader passed (its holes):",
            "",
            *(holes or ["- none"]),
            "",
            "Answers that hung, crashed the grader or took over 5 minutes:",
            "",
            *(slow or ["- none"]),
            "",
            "Every answer, with the grader's first failing check (hint cut at 160 characters):",
            "",
            *every_answer(payload["rows"]),
            end,
        ]
    )
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text += "\n" + section + "\n"
    readme.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated exercises (module names)")
    ap.add_argument("--answers", default="", help="comma-separated answer names")
    ap.add_argument("--hang", type=float, default=330.0, help="seconds without a verdict before a hang is recorded")
    ap.add_argument("--no-solutions", action="store_true", help="skip the solutions")
    ap.add_argument("--readme", action="store_true", help="only rewrite README.md from the JSON")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker[0]), Path(args.worker[1]))
    payload = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    if args.readme:
        return write_readme(payload)
    only = [m for m in args.only.split(",") if m] or MODULES
    wanted = {a for a in args.answers.split(",") if a}
    log = HERE / "run.log"
    new = []
    for module in only:
        rows = [
            r
            for r in answers_in(module)
            if not wanted or r["name"] in wanted or (r["kind"] == SOLUTION and not args.no_solutions)
        ]
        if args.no_solutions:
            rows = [r for r in rows if r["kind"] != SOLUTION]
        if wanted and not any(r["name"] in wanted for r in rows):
            continue
        print(f"{module}: {len(rows)} to grade", flush=True)
        shared = [r for r in rows if r["kind"] in (SOLUTION, "honest")]
        if shared:
            new += run_group(shared, args.hang, log)
        for r in rows:
            if r["kind"] == "deliberate":
                new += run_group([r], args.hang, log)
        keep = {(r["exercise"], r["name"]) for r in new}
        rows_all = [r for r in payload["rows"] if (r["exercise"], r["name"]) not in keep] + new
        order = {m: i for i, m in enumerate(MODULES)}
        rows_all.sort(key=lambda r: (order.get(r["module"], 99), r["kind"] != SOLUTION))
        payload = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "note": "grading.check on the shared 2-vCPU development machine under load from other sessions, "
            "SIMLIB_QUICK=1; seconds are wall time of one check call, one run each",
            "rows": rows_all,
        }
        RESULTS.write_text(json.dumps(payload, indent=1) + "\n")  # after every exercise: a partial run keeps its rows
    write_readme(payload)
    graded = [r for r in payload["rows"] if r["kind"] != SOLUTION]
    print(
        f"caught {sum(not r['passed'] for r in graded)} of {len(graded)}; solutions passing: "
        f"{sum(r['passed'] for r in payload['rows'] if r['kind'] == SOLUTION)} of "
        f"{sum(r['kind'] == SOLUTION for r in payload['rows'])}"
    )


if __name__ == "__main__":
    main()
