"""How much communication prefetching hides in ZeRO-3, measured from torch.profiler's trace.

    python benchmarks/zero3_prefetch.py         # ~3 min on 2 idle cores

The full-size GPT (4 blocks), 2 processes, the course's Zero3 against Zero3Prefetch (the exercise's solution),
8 steps each (2 warm-up), alternating twice, each run profiled with ``simlib.debug.trace.profile``. Two measures
per step: the time the main thread was blocked waiting for all-gathers (timed around each wait; the baseline is
the same class with its hooks doing nothing, i.e. the plain Zero3), and the trace's exposed communication
(communication slices and the main thread's collective calls, during which the main thread ran no operator;
it counts Python time between operators as exposed, which a loaded machine inflates). Also: losses equal (prefetching changes when parameters arrive, not their values). Target: exposed
communication lower with prefetching. On Gloo/CPU the all-gather shares the two cores with the compute, so
what it can hide here is bounded; the simulator shows the GPU picture.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

STEPS, WARMUP, ROUNDS = 8, 2, 2


def run(out_dir, prefetch: bool):
    import torch
    import torch.distributed as dist

    from simlib.debug import trace
    from simlib.parallel.zero_prefetch import Zero3Prefetch
    from simlib.projects.gpt.task import GPTTask
    from simlib.timeline import Timeline

    task = GPTTask()
    model = task.build_model()
    if prefetch:
        z = Zero3Prefetch(model, blocks=task.blocks(model))
    else:  # the same machinery (and clocks) with the hooks doing nothing: the plain Zero3's behaviour

        class NoPrefetch(Zero3Prefetch):
            def on_forward(self, i):
                pass

            def on_backward(self, i):
                pass

        z = NoPrefetch(model, blocks=task.blocks(model))
    opt = torch.optim.AdamW(z.parameters(), lr=3e-3)
    tl = Timeline(warmup=WARMUP)
    losses, blocked = [], []
    with trace.profile(out_dir) as prof:
        for step in range(STEPS):
            before = z.blocked_s
            x, y = task.batch(step, dist.get_rank(), dist.get_world_size())
            with tl.step(step):
                opt.zero_grad()
                loss = task.loss(z(x), y)
                loss.backward()
                opt.step()
            losses.append(float(loss.detach()))
            blocked.append(z.blocked_s - before)
    steps = [r["duration"] for r in tl.records() if r["kind"] == "step" and not r["warmup"]]
    return {
        "path": str(prof.path) if prof.path else None,
        "losses": losses,
        "step_time": statistics.median(steps),
        "counts": z.counts,
        "blocked_s": statistics.median(blocked[WARMUP:]),
    }


def main() -> None:
    import simlib
    from simlib.debug import trace

    load = os.getloadavg()
    res = {"zero3": [], "zero3_prefetch": []}
    losses = {}
    with simlib.Cluster(2, timeout=120) as cluster, tempfile.TemporaryDirectory() as d:
        for r in range(ROUNDS):
            for name, prefetch in (("zero3", False), ("zero3_prefetch", True)):
                out = cluster.run(run, os.path.join(d, f"{name}{r}"), prefetch)[0]
                t = trace.exposed_comm(out["path"])
                res[name].append(
                    {
                        "exposed_comm_s": t["exposed_comm_time"],
                        "comm_s": t["comm_time"],
                        "blocked_in_all_gather_s": out["blocked_s"],
                        "step_time_s": out["step_time"],
                        "counts": out["counts"],
                    }
                )
                losses[name] = out["losses"]
                print(name, res[name][-1])
    med = {k: statistics.median(x["exposed_comm_s"] for x in v) for k, v in res.items()}
    blocked = {k: statistics.median(x["blocked_in_all_gather_s"] for x in v) for k, v in res.items()}
    result = {
        "benchmark": "zero3_prefetch",
        "steps": STEPS,
        "warmup": WARMUP,
        "rounds": ROUNDS,
        "runs": res,
        "exposed_comm_median_s": med,
        "hidden_fraction": 1 - med["zero3_prefetch"] / med["zero3"],
        "blocked_in_all_gather_median_s": blocked,
        "all_gather_wait_hidden_fraction": 1 - blocked["zero3_prefetch"] / blocked["zero3"],
        "losses_equal": losses["zero3"] == losses["zero3_prefetch"],
        "losses": losses,
        "target": "less time blocked in all-gathers with prefetching, losses equal",
        "met": blocked["zero3_prefetch"] < blocked["zero3"] and losses["zero3"] == losses["zero3_prefetch"],
        "machine": report.machine(load, shared="the 2-core machine was shared with other sessions"),
    }
    print("wrote", report.write(result))


if __name__ == "__main__":
    main()
