"""Measured pipeline bubble against (p - 1) / (m + p - 1), for p = 2 and 4 stages and m = 1..8 micro-batches.

Runs simlib's executor with the 1F1B schedule (and GPipe for comparison) on an MLP split into equal stages,
with the micro-batch size fixed so a forward costs the same at every m. Bubble = 1 - (forward + backward
time of a rank) / step time, averaged over ranks; median over the measured steps (warm-up excluded).

    python benchmarks/pipeline_bubble.py [--steps 12] [--out benchmarks/results/pipeline_bubble.json]

No target: the benchmark reports how far the measurement sits above the formula and why (messages cost
milliseconds over Gloo on a shared 2-core machine; p = 4 runs 4 processes on 2 cores, oversubscribed).
"""

from __future__ import annotations

import argparse
import os
import warnings

import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib.lessons import pipeline as experiments
from simlib.parallel import schedules


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pipeline_bubble.json"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    sizes = dict(width=args.width, depth=8, micro_batch=args.micro_batch, steps=args.steps, warmup=2)
    rows = []
    for p in (2, 4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", simlib.OversubscribedWarning)
            cluster = simlib.Cluster(p, timeout=120)
        try:
            for schedule in ("1f1b", "gpipe"):
                for m in range(1, 9):
                    table = cluster.run(experiments.simlib_steps, schedule, m, **sizes)[0]["table"]
                    row = dict(
                        stages=p,
                        schedule=schedule,
                        microbatches=m,
                        **experiments.bubble(table),
                        formula=schedules.bubble_fraction(p, m),
                        **experiments.compute_times(table),
                    )
                    rows.append(row)
                    print(
                        f"p={p} {schedule:>5} m={m}: bubble {row['bubble']:.3f} (IQR {row['bubble_iqr']:.3f}) "
                        f"formula {row['formula']:.3f}, step {row['step_time'] * 1e3:.1f} ms",
                        flush=True,
                    )
        finally:
            cluster.close()
    result = dict(
        benchmark="pipeline_bubble",
        machine=report.machine(load),
        sizes=sizes,
        note=(
            "measured on a 2-core machine shared with other jobs: timings may be loaded and noisy. "
            "p = 4 runs 4 single-thread processes on 2 cores (oversubscribed). The formula assumes "
            "equal stages and free communication; each Gloo message here costs ~0.1-5 ms."
        ),
        rows=rows,
    )
    print("wrote", report.write(result, args.out))


if __name__ == "__main__":
    main()
