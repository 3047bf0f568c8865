"""How many wrong answers does the grader catch? Mutation testing of every exercise's solution.

    python benchmarks/grader_mutation.py                                   # every exercise with a probe
    python benchmarks/grader_mutation.py --exercise 02_average_gradients --max-mutants 50

For an exercise: the solution's answer code (the nbgrader regions of ``solutions/NN_name.ipynb``) is mutated
with :mod:`simlib.grading.mutants` (>= 50 mutants: every single-point mutant, then two- and three-point ones
for a short answer). A mutant whose cells fail to compile or run ("import") does not count. The rest are
graded by the real grader, ``simlib.grading.check(name, answer)`` (what the exercise notebook's check cell
calls), on warm clusters of 2, 3 and 4 ranks shared by every mutant (a mutant that hangs costs the Gloo timeout
plus a restart of that cluster). Then, for a mutant the grader *passed*:

- **equivalent** (discarded): on random instances drawn here (sizes, world sizes 2, 3 and 4, values; see each
  ``_probe_*``) its outputs equal the solution's (the one-process reference's, to 1e-6 relative in float64)
  *and* every rank called the same collectives (operation, shape, peer, from the hang finder's log);
- **survived** otherwise: a wrong answer (or one that breaks the exercise's communication contract) that the
  grader passed. Survivors are listed with their mutation.

A mutant the grader fails is **caught** (by status: fail, error, timeout). Catch rate = caught / (caught +
survived).

What this measures, and what it does not (issue 47): AST mutants are small, mechanical edits of the solution (an
operator, a constant, an index); a learner's mistakes are not, so a high catch rate here says the checks notice
small edits of the right answer, not that they catch what learners get wrong (``grader_mistakes.py`` measures
that). Each probe draws its instances from a space WIDER than the check's own generator (other sizes, head dims,
vocabularies, world sizes and seeds; see ``grader_probes.py``), so a mutant called equivalent is right beyond what
the check looks at, not merely on the check's own blind spots. Results go to ``benchmarks/results/grader_mutation.json``, merged per exercise (a run with
``--exercise`` updates only that exercise's entry).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402
from grader_probes import ORDER, PROBES  # noqa: E402


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


class _Alarm(Exception):
    pass


def _with_alarm(seconds, fn, *args, **kwargs):
    """``fn`` in this process with a limit (an in-process check of a mutant that loops forever)."""

    def ring(*_):
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(int(seconds))
    try:
        return fn(*args, **kwargs)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _observe(probe, worlds, answer, clusters, seeds, limit):
    """The probe's outputs on every world size and seed; None when the answer fails, hangs or overruns."""
    from simlib.launch import WorkerError

    seen = []
    for seed in seeds:
        if not worlds:
            try:
                seen.append(_with_alarm(limit, probe, answer, seed))
            except (Exception, _Alarm):  # noqa: BLE001 - a mutant that crashes is not equivalent
                return None
        for n in worlds:
            try:
                seen.append(clusters[n].call(probe, (answer, seed), timeout=limit))
            except WorkerError:
                return None
            except Exception:  # noqa: BLE001 - e.g. an answer cloudpickle cannot send
                return None
    return seen


def _clusters(worlds):
    from simlib.launch import Cluster, OversubscribedWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscribedWarning)
        return {n: Cluster(n, timeout=5.0, threads=1, grace=2.0) for n in worlds}


def run_exercise(notebook: str, max_mutants: int | None, seed: int, clusters: dict, limit: float) -> dict:
    from simlib import grading
    from simlib.grading import mutants as M

    name, probe, worlds = PROBES[notebook]
    answer_name = next(e["answer"] for e in _entries(notebook) if e["exercise"] == name)
    t0 = time.monotonic()
    all_mutants = M.mutate(M.answer_cells(ROOT / "solutions" / f"{notebook}.ipynb"), at_least=50, seed=seed)
    chosen = all_mutants
    if max_mutants is not None and len(all_mutants) > max_mutants:
        chosen = sorted(random.Random(seed).sample(all_mutants, max_mutants), key=lambda m: m.id)
    solution = M.load([src for src, _ in M.answer_cells(ROOT / "solutions" / f"{notebook}.ipynb")], notebook)
    verdict = grading.check(name, solution[answer_name], clusters=clusters, timeout=limit, quiet=True)
    if not verdict.passed:
        raise SystemExit(f"{notebook}: the solution itself fails the grader: {verdict.failed()[0].line()}")
    seeds = [seed * 1000 + k for k in range(2)]
    reference = _observe(probe, worlds, solution[answer_name], clusters, seeds, limit)
    assert reference is not None, f"{notebook}: the solution fails its own probe"
    rows, counts = [], dict(import_failed=0, equivalent=0, caught=0, survived=0)
    by_status: dict = {}
    for m in chosen:
        t = time.monotonic()
        row = m.to_dict()
        try:
            answer = M.load(m.sources, f"mutant {m.id}")[answer_name]
        except BaseException as exc:  # noqa: BLE001 - it does not count
            row.update(outcome="import_failed", why=f"{type(exc).__name__}: {exc}")
            counts["import_failed"] += 1
            rows.append(row)
            continue
        try:
            verdict = (
                grading.check(name, answer, clusters=clusters, timeout=limit, quiet=True)
                if worlds
                else _with_alarm(limit * 4, grading.check, name, answer, quiet=True)
            )
            status = verdict.status
            first = next((r for r in verdict.results if not r.passed), None)
            row["check"] = first.name if first else None
        except _Alarm:
            status = "timeout (benchmark alarm)"
        if status != "pass":
            row["outcome"] = "caught"
            row["status"] = status
            by_status[status] = by_status.get(status, 0) + 1
        else:
            seen = _observe(probe, worlds, answer, clusters, seeds, limit)
            row["outcome"] = "equivalent" if seen is not None and _same(seen, reference) else "survived"
        counts[row["outcome"]] += 1
        row["seconds"] = round(time.monotonic() - t, 2)
        rows.append(row)
        print(
            f"  {notebook} mutant {m.id:3d} {row['outcome']:10s} {row.get('status', ''):10s} {m.description}",
            flush=True,
        )
    judged = counts["caught"] + counts["survived"]
    return dict(
        exercise=name,
        notebook=notebook,
        mutants=len(chosen),
        generated=len(all_mutants),
        **counts,
        caught_by_status=by_status,
        catch_rate=round(counts["caught"] / judged, 4) if judged else None,
        survivors=[r for r in rows if r["outcome"] == "survived"],
        equivalents=[r["mutation"] for r in rows if r["outcome"] == "equivalent"],
        seconds=round(time.monotonic() - t0, 1),
        rows=rows,
    )


def _entries(notebook):
    import nbformat

    from simlib.exercises import exercises_of

    return exercises_of(nbformat.read(str(ROOT / "solutions" / f"{notebook}.ipynb"), as_version=4))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exercise", action="append", help=f"notebook name (repeatable); one of {sorted(PROBES)}")
    parser.add_argument("--max-mutants", type=int, default=None, help="grade at most this many (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="the grader's limit per run, seconds")
    parser.add_argument("--out", default=str(report.RESULTS / "grader_mutation.json"))
    args = parser.parse_args(argv)
    wanted = args.exercise or list(ORDER)
    unknown = [e for e in wanted if e not in PROBES]
    if unknown:
        parser.error(f"no equivalence probe for {unknown}: known {sorted(PROBES)}")
    load = os.getloadavg()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else dict(benchmark="grader_mutation", exercises={})
    clusters = _clusters(sorted({n for e in wanted for n in PROBES[e][2]}))
    try:
        for notebook in wanted:
            entry = run_exercise(notebook, args.max_mutants, args.seed, clusters, args.timeout)
            result["exercises"][notebook] = entry
            result["machine"] = report.machine(load, shared="the 2-core machine was shared with other sessions")
            report.write(result, out)
            rate = entry["catch_rate"]
            print(
                f"{notebook}: {entry['mutants']} mutants, {entry['equivalent']} equivalent, {entry['caught']} caught,"
                f" {entry['survived']} survived, {entry['import_failed']} failed to import; catch rate "
                f"{'n/a' if rate is None else f'{100 * rate:.1f} %'} ({entry['seconds']:.0f} s)",
                flush=True,
            )
            for s in entry["survivors"]:
                print(f"    survived: {s['mutation']}")
    finally:
        for c in clusters.values():
            c.close()
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
