"""Fault injection: what a reliability engineer would try on a 2-rank training run, and what happens.

Each probe injects one fault through the real stack (simlib.train, simlib.checkpoint over
torch.distributed.checkpoint, the elastic agent behind simlib.launch) and records its outcome:

    right        the run did the right thing (resumed bit-equal, fell back and said so, ran both calls, ...)
    clear error  it stopped with one line naming the cause (and the rank or step) and what to do, losing nothing
    FAIL         anything else: a hang, a silent wrong answer, a traceback wall, lost work

    python benchmarks/faults.py [--only substring] [--out benchmarks/results/faults.json]

The probes live beside this runner, one module per concept: ``faults_checkpoints.py`` (broken checkpoints, full and
read-only disks, a resume with another run), ``faults_processes.py`` (ranks killed or stopped, the parent killed,
threads and concurrent launches), ``faults_inputs.py`` (NaN, bad arguments, wrong batch sizes),
``faults_reports.py`` (what issue 38 found: unverifiable checkpoints, two runs in one folder, the disk estimate, task
sizes, reports of a killed rank and of NaN, layout changes, class grading) and ``faults_followups.py`` (what issue
51 found still open); ``faults_common.py`` holds what they share.

The full disk is a real one: a tmpfs mounted with a size limit (needs root; else that probe says it was skipped).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import faults_checkpoints  # noqa: F401 - each module registers its probes as it is imported
import faults_followups  # noqa: F401 - the probes of issue 51
import faults_inputs  # noqa: F401
import faults_processes  # noqa: F401
import faults_reports  # noqa: F401 - the probes of issue 38
import report  # benchmarks/report.py: machine info and the JSON file
from faults_common import PROBES, Context, _error_line


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="run the probes whose name contains this (a|b: either)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="faults-"))
    ctx = Context(root)
    rows = []
    try:
        for name, fn in PROBES:
            if args.only and not any(part in name for part in args.only.split("|")):
                continue
            t0 = time.perf_counter()
            try:
                row = fn(ctx)
            except Exception as exc:  # noqa: BLE001 - a probe that raised unexpectedly is a failure to report
                row = dict(
                    outcome="FAIL",
                    detail=_error_line(exc)[:600],
                    nothing_lost=None,
                    traceback=traceback.format_exc()[-1500:],
                )
            row = dict(probe=name, **row, seconds=round(time.perf_counter() - t0, 1))
            rows.append(row)
            print(f"{row['outcome']:12s} {name}: {row['detail'][:300]}", flush=True)
    finally:
        ctx.cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("right", "clear error", "FAIL", "skipped")}
    result = dict(
        benchmark="faults",
        world_size=2,
        probes=rows,
        counts=counts,
        all_right_or_clear=counts["FAIL"] == 0,
        machine=report.machine(load_before, shared="yes: up to 8 helpers on 2 cores"),
    )
    path = report.write(result, args.out)
    print(f"\n{counts}; wrote {path}")


if __name__ == "__main__":
    main()
