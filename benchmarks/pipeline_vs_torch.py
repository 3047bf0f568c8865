"""simlib's pipeline executor against ``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe /
Schedule1F1B): step time on the same model, split, micro-batches and data, 2 ranks, Gloo.

Rounds alternate simlib and torch so a busy machine's slow moments spread over both; each figure is the median
over rounds of the per-round median step time. Also records both losses (they must agree).

    python benchmarks/pipeline_vs_torch.py [--rounds 5] [--out benchmarks/results/pipeline_vs_torch.json]
"""

from __future__ import annotations

import argparse
import os
import statistics

import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib.lessons import pipeline as experiments
from simlib.timeline import summarize


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "pipeline_vs_torch.json"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    sizes = dict(width=512, depth=8, micro_batch=64, steps=args.steps, warmup=2)
    rows = []
    cluster = simlib.Cluster(2, timeout=120)
    try:
        for schedule in ("gpipe", "1f1b"):
            for m in (4, 8):
                ours, theirs, losses = [], [], {}
                for _ in range(args.rounds):
                    a = cluster.run(experiments.simlib_steps, schedule, m, **sizes)
                    b = cluster.run(experiments.torch_steps, schedule, m, **sizes)
                    ours.append(summarize(a[0]["table"])["step_time"])
                    theirs.append(summarize(b[0]["table"])["step_time"])
                    losses = dict(simlib=a[-1]["loss"], torch=b[-1]["loss"])
                row = dict(
                    schedule=schedule,
                    microbatches=m,
                    simlib_step_s=statistics.median(ours),
                    torch_step_s=statistics.median(theirs),
                    simlib_rounds=ours,
                    torch_rounds=theirs,
                    ratio=statistics.median(ours) / statistics.median(theirs),
                    **{f"{k}_loss": v for k, v in losses.items()},
                )
                rows.append(row)
                print(
                    f"{schedule:>5} m={m}: simlib {row['simlib_step_s'] * 1e3:.1f} ms, torch "
                    f"{row['torch_step_s'] * 1e3:.1f} ms, ratio {row['ratio']:.2f}; losses {losses}",
                    flush=True,
                )
    finally:
        cluster.close()
    result = dict(
        benchmark="pipeline_vs_torch",
        machine=report.machine(load),
        sizes=sizes,
        note="2-core machine shared with other jobs: timings may be loaded and noisy (medians over rounds).",
        rows=rows,
    )
    print("wrote", report.write(result, args.out))


if __name__ == "__main__":
    main()
