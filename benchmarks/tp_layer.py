"""A tensor-parallel MLP block (simlib, and DTensor's parallelize_module) against the unsplit block.

Forward + backward of one transformer MLP block, 2 ranks over Gloo, against the unsplit block in one process
with 1 thread and with 2 threads (the honest rival on a 2-core machine), in alternating rounds. Also the
bytes all-reduced per step against the formula 2·B·S·H·4 and the time those all-reduces take.

    python benchmarks/tp_layer.py [--rounds 5] [--out benchmarks/results/tp_layer.json]
"""

from __future__ import annotations

import argparse
import os

import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib.lessons import tensor as experiments


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "tp_layer.json"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    configs = [dict(hidden=512, batch=4, seq=128, steps=10), dict(hidden=1024, batch=4, seq=128, steps=6)]
    results = []
    cluster = simlib.Cluster(2, timeout=120)
    try:
        for sizes in configs:
            rows = experiments.compare(cluster, "mlp", rounds=args.rounds, **sizes)
            tp = cluster.run(experiments.tp_steps, "mlp", **sizes)[0]
            results.append(
                dict(
                    sizes=sizes,
                    rows=rows,
                    step_bytes=tp["step_bytes"],
                    formula_bytes=tp["formula"]["step_payload_bytes"],
                    comm_s=tp["comm_seconds"],
                    tp_step_s=tp["median"],
                )
            )
            for r in rows:
                print(f"{sizes}: {r['setup']:>32}: {r['ms']:.1f} ms (spread {r['spread_ms']:.1f})", flush=True)
            print(
                f"  bytes all-reduced per step {tp['step_bytes']} (formula {tp['formula']['step_payload_bytes']}), "
                f"all-reduce time {tp['comm_seconds'] * 1e3:.1f} ms of {tp['median'] * 1e3:.1f} ms",
                flush=True,
            )
    finally:
        cluster.close()
    out = dict(
        benchmark="tp_layer",
        machine=report.machine(load),
        note="2-core machine shared with other jobs: timings may be loaded and noisy (medians over rounds).",
        results=results,
    )
    print("wrote", report.write(out, args.out))


if __name__ == "__main__":
    main()
