"""How fast the planner searches: combinations and priced plans per second on one core, and the time for a
405B model on 16,384 H100s (the case the issue names), a 70B on 1,024 and an 8B on 64.

Each search is run 3 times in this process (the first includes the per-layer costs' cache filling: every search
starts with an empty cache, so each time is a cold search); the median is reported with the load average, since
the box is shared. Run: ``python benchmarks/planner_speed.py``; writes benchmarks/results/planner_speed.json.
"""
import os
import statistics
import time

from simlib import sim

import report  # benchmarks/report.py: machine info and the JSON file

CASES = [  # (name, model, preset, nodes, global batch in sequences)
    ("llama3-405b on 16,384 H100 (2,048 nodes), batch 2,048 x 8,192 tokens", "405B", "h100", 2048, 2048),
    ("llama3-70b on 1,024 H100 (128 nodes), batch 1,024", "70B", "h100", 128, 1024),
    ("llama3-8b on 64 H100 (8 nodes), batch 512", "8B", "h100", 8, 512),
]


def main():
    load = os.getloadavg()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for name, model, hw, nodes, gb in CASES:
        times, result = [], None
        for _ in range(3):
            t = time.perf_counter()
            result = sim.plan(model, hw, nodes=nodes, global_batch=gb)
            times.append(time.perf_counter() - t)
        best = result.best
        priced = len(result.ranked)
        rows.append(dict(case=name, devices=result.world_size, combinations=result.considered,
                         refused=sum(result.refused.values()), over_memory=len(result.too_big), priced=priced,
                         seconds_median=statistics.median(times), seconds_all=times,
                         combinations_per_s=result.considered / statistics.median(times),
                         priced_per_s=priced / statistics.median(times),
                         best=sim.planner.label(best["strategy"]), best_step_s=best["step_time"],
                         best_mfu=best["mfu"], exact_fallback=result.exact))
        print(f"{name}: {result.considered:,} combinations ({priced:,} priced) in "
              f"{statistics.median(times):.2f} s -> {rows[-1]['combinations_per_s']:,.0f}/s; best {rows[-1]['best']}")
    out = dict(benchmark="planner_speed", machine=report.machine(load), cases=rows,
               note="one core (the planner is single-threaded Python); a shared 2-core box, see the load average")
    print(f"wrote {report.write(out)}")


if __name__ == "__main__":
    main()
