"""Data-parallel strong scaling at 2 workers on a compute-bound step, against one single-thread process.

Target: >= 1.6x (two single-thread processes ran matmul at 51 GFLOP/s each against 58 for one: ~1.76x is the
ceiling here). Beside it, the honest rival: one process using every core. Every point is
``simlib scaling``'s own sweep (the one training loop, fresh processes per point), so the benchmark measures
what the command and lesson 00 run. Run: `python benchmarks/dp_scaling.py [rounds]` (a few minutes); writes
benchmarks/results/dp_scaling.json.
"""

import os
import sys
import time

import numpy as np
import pandas as pd
import report  # benchmarks/report.py: machine info and the JSON file

from simlib.lessons.scaling import scaling, speedup_table
from simlib.tasks import RegressionTask

TARGET = 1.6
CONFIG = dict(width=1024, depth=4, global_batch=4096, steps=6, warmup=2)


def main(rounds: int = 3) -> dict:
    """``simlib scaling``'s own sweep (``simlib.lessons.scaling.scaling``: the one training loop, fresh processes
    per point) at 1 and 2 processes and the 2-thread rival, ``rounds`` times; medians over the rounds."""
    started, load = time.time(), os.getloadavg()
    runs = [scaling((1, 2), mode="strong", progress=False, **CONFIG) for _ in range(rounds)]
    loads = [load, os.getloadavg()]
    rows = []
    cores = int(runs[0].attrs["cores"])
    names = {
        (1, False): "1 process x 1 thread",
        (2, False): "2 processes x 1 thread",
        (1, True): f"1 process x {cores} threads",
    }
    for (world, rival), name in names.items():
        picked = [r for t in runs for _, r in t.iterrows() if r.world_size == world and pd.notna(r.baseline) == rival]
        threads = int(picked[0].threads)
        med = float(np.median([r.step_time for r in picked]))
        rows.append(
            dict(
                world_size=world,
                threads=threads,
                step_time=med,
                throughput=CONFIG["global_batch"] / med,
                step_time_p25=float(np.median([r.step_time_p25 for r in picked])),
                step_time_p75=float(np.median([r.step_time_p75 for r in picked])),
                comm_fraction=float(np.median([r.comm_fraction for r in picked])),
                baseline=name if rival else None,
                name=name,
                rounds=[float(r.step_time) for r in picked],
            )
        )
    table = speedup_table(rows, "strong")
    flops = (
        CONFIG["global_batch"]
        * RegressionTask(width=CONFIG["width"], depth=CONFIG["depth"], num_samples=8, eval_samples=1).flops_per_sample
    )
    results = {
        r["name"]: dict(
            step_s=r["step_time"],
            iqr_s=[r["step_time_p25"], r["step_time_p75"]],
            speedup=float(r["speedup"]),
            gflops=flops / r["step_time"] / 1e9,
            comm_fraction=r["comm_fraction"],
            step_s_per_round=r["rounds"],
        )
        for _, r in table.iterrows()
    }
    two = results["2 processes x 1 thread"]["speedup"]
    out = dict(
        benchmark="dp_scaling",
        target=f"2 workers >= {TARGET}x one single-thread process",
        met=bool(two >= TARGET),
        speedup_2_workers=two,
        speedup_1_process_all_cores=results[names[(1, True)]]["speedup"],
        results=results,
        config=dict(CONFIG, optimizer="SGD", mode="simlib scaling: simlib.train, Plan(dp=N, dp_variant='flat')"),
        method=f"{rounds} rounds of `simlib scaling` (fresh processes per point, {CONFIG['steps']} timed steps, "
        f"{CONFIG['warmup']} warm-up); medians over rounds; FLOPs = 6 x batch x weights",
        machine=report.machine(load),
        load_at_end=list(loads[-1]),
        note="the machine is shared with other engineers running tests: timings may include their load",
        seconds=round(time.time() - started, 1),
    )
    report.write(out)
    return out


if __name__ == "__main__":
    res = main(*(int(a) for a in sys.argv[1:]))
    for name, r in res["results"].items():
        print(f"{name:24s} step {r['step_s'] * 1e3:7.1f} ms  speedup {r['speedup']:.2f}x  {r['gflops']:.0f} GFLOP/s")
