"""Project 2 (vision): samples/s and time to the target held-out accuracy at 1 process x 1 thread, 1 process x
2 threads, 2 and 4 processes (one thread each), through simlib.train (the project's standard run, SyncBatchNorm
when data-parallel). Every set-up runs in warm workers of the same kind (simlib.Cluster); rounds interleave so
drifting load hits every set-up alike; medians over rounds. Run: `python benchmarks/project_vision.py [rounds]
[--quick]`; writes benchmarks/results/project_vision.json.
"""

import os
import sys
import time
import warnings

import numpy as np
import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib.projects.runner import PROJECTS

SETUPS = {"1 process x 1 thread": (1, 1), "1 process x 2 threads": (1, 2), "2 processes": (2, 1), "4 processes": (4, 1)}


def _run_in_cluster(project, quick):
    """On every rank of a warm cluster: the project's standard run (world size = the cluster's)."""
    import torch.distributed as dist

    from simlib.projects.runner import PROJECTS
    from simlib.train import Plan, train

    spec = PROJECTS[project](quick)
    task = spec.pop("task")
    world = dist.get_world_size()
    plan = Plan(dp=world, sync_batchnorm=(project == "vision" and world > 1))
    record = train(task, plan, verbose=False, **spec)
    return record.summary


def measure(project: str, rounds: int = 2, quick: bool = False) -> dict:
    started, load = time.time(), os.getloadavg()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        clusters = {name: simlib.Cluster(w, threads=t, timeout=600) for name, (w, t) in SETUPS.items()}
    runs = {name: [] for name in SETUPS}
    try:
        for _ in range(rounds):
            for name, cluster in clusters.items():
                runs[name].append(cluster.call(_run_in_cluster, (project, quick), timeout=3000)[0])
    finally:
        for cluster in clusters.values():
            cluster.close()
    results = {}
    for name, summaries in runs.items():
        ttt = [s["time_to_target"] for s in summaries if s.get("target_reached")]
        results[name] = dict(
            samples_per_s=float(np.median([s["samples_per_s"] for s in summaries])),
            samples_per_s_all=[s["samples_per_s"] for s in summaries],
            time_to_target_s=float(np.median(ttt)) if ttt else None,
            time_to_target_all=ttt,
            reached=f"{len(ttt)}/{len(summaries)}",
            final_eval=summaries[-1]["final_eval"],
            step_time_iqr_s=summaries[-1]["step_time_iqr"],
            threads=summaries[-1]["threads"],
            loadavg_at_end=summaries[-1]["loadavg"],
        )
    base = results["1 process x 1 thread"]
    for r in results.values():
        r["throughput_speedup"] = r["samples_per_s"] / base["samples_per_s"]
        r["time_to_target_speedup"] = (
            base["time_to_target_s"] / r["time_to_target_s"]
            if base["time_to_target_s"] and r["time_to_target_s"]
            else None
        )
    spec = PROJECTS[project](quick)
    task = spec["task"]
    out = dict(
        benchmark=f"project_{project}",
        project=project,
        quick=quick,
        target=spec["target"],
        config=dict(task=repr(task), steps=spec["steps"], eval_every=spec["eval_every"], optim=repr(spec["optim"])),
        results=results,
        method=f"{rounds} interleaved round(s) of the standard run per set-up (warm simlib.Cluster workers); "
        "samples/s from the median step (warm-up excluded); time to target = training seconds to the "
        "first evaluation at or past the target (evaluation not counted); medians over rounds",
        machine=report.machine(load),
        note="the machine is shared with other engineers running tests: timings include their load "
        "(see loadavg_before/after and each set-up's loadavg_at_end)",
        seconds=round(time.time() - started, 1),
    )
    report.write(out)
    return out


def show(res):
    for name, r in res["results"].items():
        ttt = f"{r['time_to_target_s']:.1f} s" if r["time_to_target_s"] else "not reached"
        print(
            f"{name:22s} {r['samples_per_s']:9.0f} samples/s ({r['throughput_speedup']:.2f}x)  "
            f"time to target {ttt}  final {r['final_eval']}"
        )
    print("load average before/after:", res["machine"]["loadavg_before"], res["machine"]["loadavg_after"])


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--quick"]
    show(measure("vision", *(int(a) for a in args), quick="--quick" in sys.argv))
