"""How fast the planner searches: combinations and priced plans per second on one core, and the time for a
405B model on 16,384 H100s (the case the issue names), a 70B on 1,024, an 8B on 64, and a mixture of experts
(Qwen3-30B-A3B) on 64 with expert parallelism searched, for its 10 best plans (``top=10``: layouts visited by a
lower bound on their step time, the search stopped past the 10th best; tests/test_planner.py holds that to the
exhaustive search's first 10 on smaller cases).

Each search is run 3 times (``--repeats N``) in this process (every search starts with empty caches, so each
time is a cold search); the median is reported with the load average and the process's CPU seconds, since the
box is shared (wall time under load overstates what one idle core takes). Run: ``python benchmarks/planner_speed.py``
(``--only moe`` for the cases whose name holds "moe"); writes benchmarks/results/planner_speed.json.
"""

import os
import statistics
import sys
import time

import report  # benchmarks/report.py: machine info and the JSON file

from simlib import sim

CASES = [  # (name, model, preset, nodes, global batch in sequences, plan()'s other arguments)
    ("llama3-405b on 16,384 H100 (2,048 nodes), batch 2,048 x 8,192 tokens", "405B", "h100", 2048, 2048, {}),
    ("llama3-70b on 1,024 H100 (128 nodes), batch 1,024", "70B", "h100", 128, 1024, {}),
    ("llama3-8b on 64 H100 (8 nodes), batch 512", "8B", "h100", 8, 512, {}),
    (
        "moe qwen3-30b-a3b on 64 H100 (8 nodes), batch 256 x 4,096 tokens, its 10 best plans",
        "qwen3-30b-a3b",
        "h100",
        8,
        256,
        dict(seq_len=4096, top=10),
    ),
    (
        "llama3-405b on 16,384 H100 (2,048 nodes), batch 2,048 x 8,192 tokens, its 10 best plans",
        "405B",
        "h100",
        2048,
        2048,
        dict(top=10),
    ),
]


def main():
    load = os.getloadavg()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    rows = []
    for name, model, hw, nodes, gb, kw in CASES:
        if only not in name:
            continue
        times, cpu, result = [], [], None
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            result = sim.plan(model, hw, nodes=nodes, global_batch=gb, **kw)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        best = result.best
        priced = result.extra["priced"]
        rows.append(
            dict(
                case=name,
                loadavg_after=os.getloadavg(),
                devices=result.world_size,
                combinations=result.considered,
                refused=sum(result.refused.values()),
                over_memory=len(result.too_big),
                priced=priced,
                top=result.top,
                pruned_by_bound=result.pruned,
                seconds_median=statistics.median(times),
                seconds_all=times,
                cpu_seconds_median=statistics.median(cpu),
                cpu_seconds_all=cpu,
                combinations_per_s=result.considered / statistics.median(times),
                priced_per_s=priced / statistics.median(times),
                best=sim.planner.label(best["strategy"]),
                best_step_s=best["step_time"],
                best_mfu=best["mfu"],
                exact_fallback=result.exact,
            )
        )
        print(
            f"{name}: {result.considered:,} combinations ({priced:,} priced, {result.pruned:,} skipped by the "
            f"bound) in {statistics.median(times):.2f} s ({statistics.median(cpu):.2f} s of CPU) -> "
            f"{rows[-1]['combinations_per_s']:,.0f}/s; best {rows[-1]['best']}",
            flush=True,
        )
    if only:  # the other cases as the last full run measured them
        import json

        old = json.loads((report.RESULTS / "planner_speed.json").read_text())["cases"]
        rows = [r for r in old if only not in r["case"]] + rows
    out = dict(
        benchmark="planner_speed",
        machine=report.machine(load),
        cases=rows,
        note="one core (the planner is single-threaded Python), measured under load on a shared 2-core box "
        "(see the load average): cpu_seconds is the process's own CPU time, seconds the wall clock; "
        "combinations_per_s counts the combinations a top-k search skipped by its bound as searched",
    )
    print(f"wrote {report.write(out)}")


if __name__ == "__main__":
    main()
