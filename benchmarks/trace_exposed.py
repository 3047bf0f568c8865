"""Exposed communication from torch.profiler's trace against the run record's own figure, on the GPT project.

    python benchmarks/trace_exposed.py          # ~3 min on 2 idle cores

The full-size GPT, 2-process data parallelism (bucketed, asynchronous all-reduces), 12 steps (2 warm-up),
profiled with ``simlib.debug.trace.profile``. The run record's ``exposed_comm_time`` comes from the course's
spans (comm spans not covered by forward/backward/optimizer spans); the trace's from torch's own record
(communication-thread slices and the main thread's collective calls, not covered by operators on the main thread).
Both cover the same measured steps and the same collectives: the gradient bucket, and the non-finite check's
all-reduce, which the record used to hide inside its optimizer span (ratio 0.87 and 1.52 before that was fixed);
a blocking call counts, in both, until the main thread runs again (on a loaded machine that includes the wait to be
scheduled: 0.76-0.82 while the trace left it out). Target: within 10 %; five runs at a load average of 8-23 gave
0.98-1.06. What is left apart: the wait to be rescheduled after the last bucket (the trace counts it when nothing
ran after that bucket's issue; the record's bucket span ends when the all-reduce completes).
Profiling slows every operator, so both figures describe the profiled run (they are compared on the same run).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

STEPS, WARMUP = 12, 2


def profiled(out_dir, plan_name):
    import torch.distributed as dist

    from simlib.debug import trace
    from simlib.projects.gpt import run as project_gpt
    from simlib.train import train

    cfg = {
        **project_gpt.settings(quick=False),
        "steps": STEPS,
        "eval_every": 0,
        "log_every": 10,
        "verbose": False,
        "measure_memory": False,
        "warmup": WARMUP,
    }
    task = cfg.pop("task")
    with trace.profile(out_dir) as prof:
        record = train(task, project_gpt.plan_for(plan_name, dist.get_world_size()), **cfg)
    return {
        "path": str(prof.path) if prof.path else None,
        "exposed": record.summary["exposed_comm_time"],
        "comm": record.summary["comm_time"],
        "step_time": record.summary["step_time"],
    }


def main() -> None:
    import simlib
    from simlib.debug import trace

    load = os.getloadavg()
    out = {}
    with simlib.Cluster(2, timeout=120) as cluster, tempfile.TemporaryDirectory() as d:
        for plan in ("dp",):
            r = cluster.run(profiled, os.path.join(d, plan), plan)[0]
            t = trace.exposed_comm(r["path"])
            out[plan] = {
                "record_exposed_comm_s": r["exposed"],
                "trace_exposed_comm_s": t["exposed_comm_time"],
                "record_comm_s": r["comm"],
                "trace_comm_s": t["comm_time"],
                "step_time_s": r["step_time"],
                "trace_exposed_per_rank_s": t["median_per_rank"],
                "ratio": t["exposed_comm_time"] / r["exposed"] if r["exposed"] else None,
            }
            print(plan, out[plan])
    ratio = out["dp"]["ratio"]
    result = {
        "benchmark": "trace_exposed",
        "steps": STEPS,
        "warmup": WARMUP,
        "plans": out,
        "target": "trace/record within 10 % on GPT dp",
        "met": ratio is not None and abs(ratio - 1) <= 0.10,
        "machine": report.machine(load, shared="the 2-core machine was shared with other sessions"),
    }
    print("wrote", report.write(result))


if __name__ == "__main__":
    main()
