"""Do the cluster-scale runs' own plans fit? Each published Megatron-Bridge / Llama 3 run that ran, built as
benchmarks/planner_experts.py builds it (its ``CASES``, set "scale"), priced by ``simlib.sim.memory_per_device``
against the planner's limit (0.9 × the GPU's memory): a run that ran and is predicted not to fit is an over-count.
Prints each run's parts and writes them to benchmarks/results/scale_runs_fit.json. Pure arithmetic: seconds (no
planner search). Run: ``python benchmarks/scale_runs_fit.py``."""

import os

import planner_experts  # benchmarks/planner_experts.py: the runs and their strategies
import report  # benchmarks/report.py: machine info and the JSON file

from simlib import sim

HEADROOM = 0.9  # simlib.sim.memory.check_fits's default, the planner's limit


def main():
    load = os.getloadavg()
    out = []
    for case in planner_experts.CASES:
        if case["set"] != "scale":
            continue
        model, hw, s = case["model"], case["hw"], case["strategy"]
        mem = sim.memory_per_device(model, s)
        limit = HEADROOM * hw.memory_bytes
        out.append(
            dict(
                run=case["run"],
                model=model.name,
                gpu=hw.name,
                plan=sim.planner.label(s),
                fits=mem["total"] <= limit,
                limit_gb=limit / 1e9,
                **{k: v / 1e9 for k, v in mem.items()},
            )
        )
    for r in out:
        print(
            f"{'fits' if r['fits'] else 'OVER'} {r['run']:26} {r['model'][:16]:16} {r['gpu'][:12]:12} "
            f"w {r['weights']:5.1f} g {r['gradients']:5.1f} o {r['optimizer']:5.1f} a {r['activations']:6.1f} "
            f"= {r['total']:6.1f} / {r['limit_gb']:5.1f} GB  {r['plan']}"
        )
    fits = sum(r["fits"] for r in out)
    print(f"{fits}/{len(out)} of the scale runs' own plans fit")
    path = report.write(
        dict(
            benchmark="scale_runs_fit",
            machine=report.machine(load),
            headroom=HEADROOM,
            summary=dict(runs=len(out), fit=fits),
            rows=out,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
