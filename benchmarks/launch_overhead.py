"""Wall time of a no-op distributed job (join the group, one barrier, leave) at 1, 2 and 4 ranks.

Compares, in one run: ``simlib.launch`` called from a Python process that already imported torch (how a
notebook uses it; with its workers forked from the zygote, :mod:`simlib.zygote`, and without: ``SIMLIB_ZYGOTE=0``), the same started from a fresh interpreter (``python -c``: equal footing with torchrun),
``torchrun`` of a script, ``torch.multiprocessing.spawn``, and a call on a warm ``simlib.Cluster``. Also
measures ``import torch`` alone: every cold start pays it once per process, so it is the floor.

    python benchmarks/launch_overhead.py [--repeats 3] [--out benchmarks/results/launch_overhead.json]

Targets (issue 2): simlib.launch within 1.2x of torchrun cold; a warm call >= 10x faster than a cold launch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import report  # benchmarks/report.py: machine info and the JSON file
import torch.distributed as dist
import torch.multiprocessing as mp

import simlib
from simlib import env

NOOP_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def noop():
    dist.barrier()


def _spawn_worker(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return dict(median=statistics.median(times), min=min(times), max=max(times), runs=times)


def _run(cmd, **kw):
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300, **kw)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "launch_overhead.json"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    warnings.simplefilter("ignore", simlib.OversubscribedWarning)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "noop.py")
        with open(script, "w") as f:
            f.write(NOOP_SCRIPT)
        results = {
            "benchmark": "launch_overhead",
            "import_torch_s": _timed(lambda: _run([sys.executable, "-c", "import torch"]), args.repeats),
        }
        per_size = {}
        for n in args.world_sizes:
            row = {}
            row["simlib_launch_in_process"] = _timed(lambda: simlib.launch(noop, n), args.repeats)
            os.environ["SIMLIB_ZYGOTE"] = "0"  # the workers import torch themselves (as before simlib.zygote)
            try:
                row["simlib_launch_in_process_no_zygote"] = _timed(lambda: simlib.launch(noop, n), args.repeats)
            finally:
                del os.environ["SIMLIB_ZYGOTE"]
            row["simlib_launch_fresh_python"] = _timed(
                lambda: _run(
                    [sys.executable, "-c", f"import simlib, launch_overhead as b; simlib.launch(b.noop, {n})"],
                    cwd=bench_dir,
                    env={**os.environ, "PYTHONPATH": bench_dir, "PYTHONWARNINGS": "ignore"},
                ),
                args.repeats,
            )
            row["torchrun"] = _timed(
                lambda: _run(
                    [
                        torchrun,
                        "--nproc-per-node",
                        str(n),
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        str(env.free_port()),
                        script,
                    ]
                ),
                args.repeats,
            )
            row["mp_spawn"] = _timed(lambda: mp.spawn(_spawn_worker, args=(n, env.free_port()), nprocs=n), args.repeats)
            with simlib.Cluster(n) as cluster:
                cluster.run(noop)
                row["warm_cluster_call"] = _timed(lambda: cluster.run(noop), max(10, args.repeats))
            row["ratio_launch_fresh_vs_torchrun"] = (
                row["simlib_launch_fresh_python"]["median"] / row["torchrun"]["median"]
            )
            row["ratio_launch_in_process_vs_torchrun"] = (
                row["simlib_launch_in_process"]["median"] / row["torchrun"]["median"]
            )
            row["warm_speedup_vs_cold_launch"] = (
                row["simlib_launch_in_process"]["median"] / row["warm_cluster_call"]["median"]
            )
            per_size[str(n)] = row
            print(
                f"world {n}: launch {row['simlib_launch_in_process']['median']:.2f} s in process "
                f"({row['simlib_launch_in_process_no_zygote']['median']:.2f} s without the zygote), "
                f"{row['simlib_launch_fresh_python']['median']:.2f} s fresh python; torchrun "
                f"{row['torchrun']['median']:.2f} s; mp.spawn {row['mp_spawn']['median']:.2f} s; warm call "
                f"{row['warm_cluster_call']['median'] * 1e3:.1f} ms",
                flush=True,
            )
        results["by_world_size"] = per_size
    results["targets"] = {
        "launch_fresh_within_1.2x_of_torchrun": all(
            r["ratio_launch_fresh_vs_torchrun"] <= 1.2 for r in per_size.values()
        ),
        "warm_call_10x_faster_than_cold": all(r["warm_speedup_vs_cold_launch"] >= 10 for r in per_size.values()),
    }
    results["machine"] = report.machine(
        load, repeats=args.repeats, note="2-core box; other jobs may have been running: medians, not means"
    )
    print(json.dumps(results["targets"]), "->", report.write(results, args.out))


if __name__ == "__main__":
    main()
