"""A yardstick for the grader: learner-style mistakes for every exercise, each proved wrong without the grader.

``benchmarks/mistakes/<exercise>/<name>.py`` holds one wrong answer per file, written from the exercise's text and
the lesson (never from the checks): a one-line docstring says what is wrong and why, ``KIND`` says whether it is an
``honest`` learner's mistake or a ``deliberate`` trick, ``PROVE`` names the input on which it differs from the
solution, and ``ANSWER`` is what the learner passes to ``grading.check``.

    .venv/bin/python benchmarks/grader_mistakes.py --prove              # each mistake beside the solution
    .venv/bin/python benchmarks/grader_mistakes.py                      # grade all, 3 times (--repeat)
    .venv/bin/python benchmarks/grader_mistakes.py --only ring_all_reduce,plan_memory --repeat 1
    .venv/bin/python benchmarks/grader_mistakes.py --answers wait_at_once --repeat 1   # some answers only

Grading goes through the public entry point, ``simlib.grading.check(name, answer)`` (the call each exercise's
check cell makes; the check picks its world sizes, 2 to 5 ranks). Each exercise's solution and honest mistakes share
one fresh process (one notebook session: warm workers, the solution first); a deliberate trick gets a process of
its own, since it may patch what it finds. An answer with no verdict after ``--limit`` seconds is recorded as a hang
and its process stopped (the rest of its group goes on in a new one). ``--prove`` runs, for each mistake, the
exercise's scenario (``mistakes/_scenarios.py``) on the mistake and on the solution, in worker processes
(``simlib.Cluster`` at the file's world size) for the distributed exercises, and shows a difference in values,
bytes held, collectives or timeline; a mistake equal to the solution is reported as NOT PROVED.

Writes ``benchmarks/results/grader_mistakes.json`` (and ``grader_mistakes_prove.json``) through report.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MISTAKES = HERE / "mistakes"
SOLUTIONS = ROOT / "solutions"
sys.path[:0] = [str(HERE), str(ROOT), str(MISTAKES)]


# ── what is graded ──────────────────────────────────────────────────────────────────────────────────────────────
@functools.cache
def exercises() -> dict:
    """{exercise: (solution notebook, the name its check cell passes)}, from the solution notebooks."""
    out = {}
    for nb in sorted(SOLUTIONS.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            m = re.search(r'grading\.check\("(\w+)",\s*(\w+)\)', "".join(cell["source"]))
            if cell["cell_type"] == "code" and m:
                out[m.group(1)] = (nb, m.group(2))
    return out


def solution_source(exercise: str) -> str:
    """The solution notebook's code cells up to its check cell (what a learner's kernel has run by then)."""
    nb, _ = exercises()[exercise]
    cells = []
    for cell in json.loads(nb.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code":
            continue
        if "grading.check(" in src:
            if f'grading.check("{exercise}"' in src:
                break
            continue  # another exercise's check, in a notebook with several (solutions/11_vision_pieces.ipynb)
        cells.append(src)
    return "\n\n".join(cells)


def mistake_files(exercise: str | None = None) -> list[Path]:
    folders = [MISTAKES / exercise] if exercise else sorted(p for p in MISTAKES.iterdir() if p.is_dir())
    return sorted(f for d in folders if d.is_dir() for f in d.glob("*.py") if not f.name.startswith("_"))


def load(path_or_source, exercise: str | None = None) -> dict:
    """Run an answer's source as a notebook cell would (module ``__main__``: its code travels by value) and return
    {answer, kind, prove, doc, name}. ``path_or_source``: a mistake file, or "solution" with ``exercise``."""
    import ast

    if path_or_source == "solution":
        source, name, kind, doc = solution_source(exercise), "solution", "solution", "the course's solution"
    else:
        path = Path(path_or_source)
        source, name = path.read_text(), path.stem
        doc = ast.get_docstring(ast.parse(source)) or ""
        kind = None
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(source, f"<{exercise}/{name}>", "exec"), ns)  # noqa: S102 - the answer, as a notebook runs it
    if kind is None:
        kind = ns.get("KIND")
    answer = ns.get("ANSWER") if name != "solution" else ns[exercises()[exercise][1]]
    return dict(answer=answer, kind=kind, prove=ns.get("PROVE", {}), doc=doc, name=name)


# ── grading: one worker process per group, one JSON line per answer ─────────────────────────────────────────────
def worker(exercise: str, names: list[str]) -> None:
    """Grade ``names`` (file paths, or "solution") of ``exercise`` one after the other; one JSON line each."""
    items = []
    for name in names:  # every answer is built before the grader is imported, as a notebook's cells run first
        try:
            items.append((name, load(name, exercise), None))
        except Exception as exc:  # noqa: BLE001 - an answer that does not even load is reported as such
            items.append((name, None, f"{type(exc).__name__}: {exc}"))
    from simlib import grading

    for name, item, error in items:
        t0 = time.perf_counter()
        if error is not None:
            row = dict(verdict="load error", detail=error)
        else:
            try:
                report = grading.check(exercise, item["answer"], quiet=True)
                passed = report.passed() if callable(report.passed) else report.passed
                failed = [r for r in report.results if not r.passed]
                row = dict(
                    verdict="passed" if passed else "caught",
                    status=str(report.status() if callable(report.status) else report.status),
                    first_failure=(failed[0].name + ": " + (failed[0].detail or failed[0].hint))[:300]
                    if failed
                    else "",
                    hint=failed[0].hint[-600:] if failed else "",  # its end: where a shrunk instance is named
                )
            except BaseException as exc:  # noqa: BLE001 - check must never raise; if it does, that is a finding
                row = dict(verdict="grader raised", detail=f"{type(exc).__name__}: {exc}"[:300])
        row.update(name=name, seconds=round(time.perf_counter() - t0, 1))
        print("@@ROW " + json.dumps(row), flush=True)
    try:
        grading.close()
    except Exception:  # noqa: BLE001, S110
        pass


def run_group(exercise: str, names: list[str], limit: float, quick: bool) -> list[dict]:
    """Grade a group in a fresh process; an answer silent for ``limit`` s is a hang: the process group is killed
    and the rest of the group goes on in a new process."""
    rows, todo = [], list(names)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if quick:
        env["SIMLIB_QUICK"] = "1"
    while todo:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", exercise, *todo],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            text=True,
            cwd=ROOT,
        )
        deadline = time.monotonic() + limit + 60  # the first answer also pays for the imports
        buffer = ""
        while todo:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:  # no verdict in time: a hang
                rows.append(
                    dict(
                        name=todo.pop(0),
                        verdict="hang",
                        seconds=limit,
                        detail=f"no verdict within {limit:.0f} s: process stopped",
                    )
                )
                break
            line = proc.stdout.readline()
            if not line:  # the process died without a verdict for this answer
                rows.append(dict(name=todo.pop(0), verdict="crashed", detail=f"exit {proc.wait()}"))
                break
            if line.startswith("@@ROW "):
                row = json.loads(line[6:])
                todo.remove(row["name"])
                rows.append(row)
                deadline = time.monotonic() + limit
            buffer = line
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        del buffer
    return rows


def grade(selected: dict, repeat: int, limit: float, quick: bool, progress=None) -> dict:
    """{exercise: {answer name: {kind, doc, verdicts: [...], rows: [...]}}}; ``progress(out)`` after each exercise."""
    out = {}
    for exercise, files in selected.items():
        meta = {"solution": dict(kind="solution", doc="the course's solution")}
        for f in files:
            item = load(f, exercise)
            meta[f.stem] = dict(kind=item["kind"], doc=item["doc"])
        honest = [str(f) for f in files if meta[f.stem]["kind"] == "honest"]
        tricks = [str(f) for f in files if meta[f.stem]["kind"] == "deliberate"]
        for r in range(repeat):
            groups = [["solution", *honest]] + [[t] for t in tricks]
            for group in groups:
                t0 = time.perf_counter()
                rows = run_group(exercise, group, limit, quick)
                for row in rows:
                    key = Path(row["name"]).stem if row["name"] != "solution" else "solution"
                    meta[key].setdefault("rows", []).append(row)
                    meta[key].setdefault("verdicts", []).append(row["verdict"])
                print(
                    f"  {exercise} run {r + 1}: {len(group)} answer(s) in {time.perf_counter() - t0:.0f} s: "
                    + ", ".join(f"{Path(x['name']).stem}={x['verdict']}" for x in rows),
                    flush=True,
                )
        out[exercise] = meta
        if progress is not None:
            progress(out)
    return out


def summarise(graded: dict) -> dict:
    table = {}
    for exercise, meta in graded.items():
        row = dict(
            honest_caught=0,
            honest_total=0,
            tricks_caught=0,
            tricks_total=0,
            solution_passes=0,
            solution_runs=0,
            flaky=[],
            passed_mistakes=[],
            hangs=[],
        )
        for name, m in meta.items():
            verdicts = m.get("verdicts", [])
            if len(set(verdicts)) > 1:
                row["flaky"].append(f"{name}: {verdicts}")
            if any(v in ("hang", "crashed", "grader raised") for v in verdicts):
                row["hangs"].append(f"{name}: {verdicts}")
            if m["kind"] == "solution":
                row["solution_runs"] += len(verdicts)
                row["solution_passes"] += sum(v == "passed" for v in verdicts)
                continue
            caught = bool(verdicts) and all(v != "passed" for v in verdicts)  # caught every time
            key = "honest" if m["kind"] == "honest" else "tricks"
            row[f"{key}_total"] += 1
            row[f"{key}_caught"] += caught
            if not caught:
                row["passed_mistakes"].append(f"{name} ({m['kind']}): {m['doc']}")
        table[exercise] = row
    return table


def print_table(table: dict) -> None:
    head = f"{'exercise':24} {'honest':>9} {'tricks':>9} {'solution':>9} flaky"
    print(head + "\n" + "-" * len(head))
    tot = [0, 0, 0, 0, 0, 0]
    for ex, r in table.items():
        vals = [
            r["honest_caught"],
            r["honest_total"],
            r["tricks_caught"],
            r["tricks_total"],
            r["solution_passes"],
            r["solution_runs"],
        ]
        tot = [a + b for a, b in zip(tot, vals)]
        print(
            f"{ex:24} {vals[0]:>4}/{vals[1]:<4} {vals[2]:>4}/{vals[3]:<4} {vals[4]:>4}/{vals[5]:<4} {len(r['flaky'])}"
        )
    print(f"{'all':24} {tot[0]:>4}/{tot[1]:<4} {tot[2]:>4}/{tot[3]:<4} {tot[4]:>4}/{tot[5]:<4}")


# ── proofs: each mistake beside the solution, no grader involved ───────────────────────────────────────────────


def _run_scenario(scenarios, exercise, answer, spec):
    """On a worker (or here for local exercises): the scenario's observables, or the error it raised."""
    try:
        return dict(ok=getattr(scenarios, exercise)(answer, spec))
    except Exception as exc:  # noqa: BLE001 - an exception is a difference the proof reports
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        return dict(error=f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}")


def differences(a, b, path="", tol=1e-5) -> list[str]:
    """Where two observables differ (floats within a relative ``tol`` are equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += differences(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}", tol)
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]", tol)
            if len(out) > 3:
                break
        return out
    if (
        isinstance(a, float)
        and isinstance(b, (int, float))
        and not isinstance(b, bool)
        or isinstance(b, float)
        and isinstance(a, (int, float))
        and not isinstance(a, bool)
    ):
        if a == b or (a != a and b != b) or abs(a - b) <= tol * max(1.0, abs(a), abs(b)):
            return []
        return [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {str(a)[:80]} vs {str(b)[:80]}"]


def prove(selected: dict, timeout: float) -> dict:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's start/stop lines, in every worker
    import _scenarios
    import _scenarios_late
    import _scenarios_pieces
    import cloudpickle

    import simlib

    for module in (_scenarios, _scenarios_late, _scenarios_pieces):
        cloudpickle.register_pickle_by_value(module)  # the workers get the scenarios by value
    results = {}
    for exercise, files in selected.items():
        solution = load("solution", exercise)["answer"]
        scenarios = _scenarios.scenario_module(exercise)
        by_size = {}
        for f in files:
            item = load(f, exercise)
            by_size.setdefault(item["prove"].get("world_size", 1), []).append((f, item))
        clusters = {}

        def call(size, answer, spec):
            """One run of the scenario on a cluster of ``size``; a run that fails on any rank (an error, a hang, a
            dead worker) leaves the workers' messages unmatched, so the cluster is replaced before the next run."""
            if clusters.get(size) is None:
                clusters[size] = simlib.Cluster(size, timeout=30.0, relay_output=False)
            try:
                out = clusters[size].call(
                    _run_scenario, (scenarios, exercise, answer, spec), timeout=spec.get("timeout", timeout)
                )
            except Exception as exc:  # noqa: BLE001 - a hang or a dead worker is a difference
                out = [dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")]
            if any("error" in r or (isinstance(r.get("ok"), dict) and r["ok"].get("error")) for r in out):
                clusters[size].close()  # (also when the scenario caught an error: peers may be left mid-message)
                clusters[size] = None
            return out

        for size, items in sorted(by_size.items()):
            for f, item in items:
                spec = item["prove"]
                if exercise in _scenarios.LOCAL:
                    mine = [_run_scenario(scenarios, exercise, item["answer"], spec)]
                    ref = [_run_scenario(scenarios, exercise, solution, spec)]
                else:
                    ref = call(size, solution, spec)
                    if any("error" in r for r in ref):  # the solution must run: once more on fresh workers
                        ref = call(size, solution, spec)
                    mine = call(size, item["answer"], spec)
                if any("error" in r for r in ref):
                    diff = []
                    print(f"  {exercise}/{f.stem}: the SOLUTION failed on this input: {ref}", flush=True)
                else:
                    diff = differences(mine, ref, tol=spec.get("tol", 1e-5))
                results.setdefault(exercise, {})[f.stem] = dict(
                    kind=item["kind"], proved=bool(diff), difference=diff[:4], spec=spec
                )
                mark = "proved" if diff else "NOT PROVED"
                print(
                    f"  {exercise}/{f.stem} ({item['kind']}, {size} rank(s)): {mark}: {'; '.join(diff[:2])[:220]}",
                    flush=True,
                )
        for c in clusters.values():
            if c is not None:
                c.close()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated exercises")
    ap.add_argument("--answers", help="comma-separated answer names (file stems)")
    ap.add_argument("--repeat", type=int, default=3, help="grade every answer this many times (default 3)")
    ap.add_argument("--quick", action="store_true", help="SIMLIB_QUICK=1 for the grading processes")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds an answer may take before it is a hang")
    ap.add_argument("--prove", action="store_true", help="prove each mistake wrong beside the solution")
    ap.add_argument("--output", help="JSON path (default benchmarks/results/grader_mistakes[_prove].json)")
    ap.add_argument(
        "--table",
        metavar="JSON",
        help="print (and rewrite) the table of an earlier run's JSON, leaving out "
        "answers whose files were removed since (e.g. a mistake the proof showed equal to the solution)",
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1:])
        return 0
    import report

    if args.table:
        data = json.loads(Path(args.table).read_text())
        for exercise, meta in data["answers"].items():
            for name in [n for n in meta if n != "solution" and not (MISTAKES / exercise / f"{n}.py").exists()]:
                del meta[name]
        data["per_exercise"] = summarise(data["answers"])
        print_table(data["per_exercise"])
        Path(args.table).write_text(json.dumps(data, indent=2) + "\n")
        return 0
    known = exercises()
    names = args.only.split(",") if args.only else sorted(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown exercise(s) {unknown}; known: {', '.join(sorted(known))}")
    wanted = set(args.answers.split(",")) if args.answers else None
    selected = {ex: [f for f in mistake_files(ex) if wanted is None or f.stem in wanted] for ex in names}
    selected = {ex: fs for ex, fs in selected.items() if fs}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    if args.prove:
        results = prove(selected, timeout=120.0)
        rows = [r for ex in results.values() for r in ex.values()]
        print(f"proved {sum(r['proved'] for r in rows)} of {len(rows)} mistakes differ from the solution")
        report.write(
            dict(
                benchmark="grader_mistakes_prove",
                machine=report.machine(load_before),
                seconds=round(time.perf_counter() - t0),
                results=results,
            ),
            args.output,
        )
        return 0 if all(r["proved"] for r in rows) else 1

    def save(graded, done=False):
        return report.write(
            dict(
                benchmark="grader_mistakes",
                machine=report.machine(load_before, quick=args.quick),
                repeat=args.repeat,
                complete=done,
                seconds=round(time.perf_counter() - t0),
                per_exercise=summarise(graded),
                answers=graded,
            ),
            args.output,
        )

    graded = grade(selected, args.repeat, args.limit, args.quick, progress=save)  # a partial run is kept too
    table = summarise(graded)
    print_table(table)
    path = save(graded, done=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
