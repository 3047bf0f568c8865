"""Expert parallelism on Gloo: load per expert and rank, dropped tokens, all-to-all bytes and time.

For ep = 2 and 4 ranks, a balanced router and a skewed one (most tokens prefer one expert), capacity factors
1.0 / 1.25 / 2.0: the tokens each expert took, the assignments dropped, the Switch auxiliary loss, the bytes the
dispatch sent per rank (against the count-exact formula and the uniform-routing one, (ep-1)/ep · tokens · k ·
hidden · 4 bytes), and Gloo's all_to_all_single against the same collective built from send/recv.

    python benchmarks/moe.py [--quick] [--out benchmarks/results/moe.json]
"""

from __future__ import annotations

import argparse
import os
import warnings

import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib.lessons import context_experts as lesson


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "moe.json"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    tokens = 256 if args.quick else 1024
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        clusters = {2: simlib.Cluster(2, timeout=300), 4: simlib.Cluster(4, timeout=300)}
    runs, engines = [], {}
    try:
        for ep, cluster in clusters.items():
            for skew in (0.0, 3.0):
                for cf in (1.0, 1.25, 2.0):
                    for engine in ("native", "p2p"):
                        rows = cluster.run(
                            lesson.moe_load_run,
                            tokens=tokens,
                            hidden=128,
                            num_experts=8,
                            top_k=2,
                            capacity_factor=cf,
                            skew=skew,
                            engine=engine,
                            repeats=3,
                        )
                        sent = sum(r["dispatch_bytes"] for r in rows)
                        runs.append(
                            dict(
                                ep=ep,
                                skew=skew,
                                capacity_factor=cf,
                                engine=engine,
                                load=[t for r in rows for t in r["tokens_per_expert"]],
                                dropped=sum(r["dropped"] for r in rows),
                                assignments=sum(r["assignments"] for r in rows),
                                aux=rows[0]["aux"],
                                dispatch_bytes=sent,
                                count_formula=sum(r["dispatch_formula"] for r in rows),
                                uniform_formula=sum(r["uniform_formula"] for r in rows),
                                step_s=max(r["seconds"] for r in rows),
                                a2a_s=max(r["a2a_s"] for r in rows),
                            )
                        )
                        r = runs[-1]
                        print(
                            f"ep={ep} skew={skew} cf={cf} {engine}: load {r['load']}, dropped {r['dropped']}/"
                            f"{r['assignments']}, aux {r['aux']:.3f}, dispatch {sent} B (counts {r['count_formula']},"
                            f" uniform {r['uniform_formula']:.0f}), all-to-all {1e3 * r['a2a_s']:.1f} ms of "
                            f"{1e3 * r['step_s']:.1f} ms",
                            flush=True,
                        )
            engines[f"ep{ep}"] = [
                cluster.run(lesson.a2a_engines_run, nbytes, repeats=10)[0] for nbytes in (1 << 14, 1 << 18, 1 << 22)
            ]
            print(f"ep={ep} all-to-all native vs send/recv: {engines[f'ep{ep}']}", flush=True)
    finally:
        for c in clusters.values():
            c.close()
    balanced = [r for r in runs if r["skew"] == 0 and r["capacity_factor"] == 2.0]
    out = dict(
        benchmark="moe",
        machine=report.machine(load),
        tokens=tokens,
        hidden=128,
        num_experts=8,
        top_k=2,
        note="2-core machine shared with other jobs (see the load average); ep=4 runs 4 processes on 2 cores.",
        runs=runs,
        all_to_all_engines=engines,
        bytes_equal_count_formula=all(r["dispatch_bytes"] == r["count_formula"] for r in runs),
        balanced_vs_uniform_formula=[r["dispatch_bytes"] / r["uniform_formula"] for r in balanced],
    )
    print(
        "dispatch bytes equal the count formula:",
        out["bytes_equal_count_formula"],
        "| balanced router / uniform formula:",
        [round(x, 3) for x in out["balanced_vs_uniform_formula"]],
    )
    print("wrote", report.write(out, args.out))


if __name__ == "__main__":
    main()
