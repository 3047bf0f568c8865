"""The planner's ranking against measured step times: every valid plan of the GPT project on 4 CPU processes.

This machine is calibrated (``sim.calibrate``: GEMMs — the course table and every GEMM shape of the space's plans,
``sim.planner.gemm_shapes`` —, memory bandwidth, Gloo all-reduce and the multi-process terms at 1, 2 and 4 processes), the
planner enumerates every plan of a stated space that ``simlib train`` runs
(``trainer_only``: Plan.validate with the task), and each plan is trained for real through the one loop
(``simlib.projects.runner.train_on`` -> ``simlib.train.train``) on a warm 4-rank cluster, in a shuffled order
so that the box's load drift does not line up with the ranking. Reported: Spearman's rank correlation between
predicted and measured step time (target >= 0.8), the measured time of the planner's first pick against the
measured best (target within 10 %), and each plan's predicted memory per rank against the measured peak of its
second step (target within 10 %), with the load average.

Step time: each plan is trained in ``--passes`` passes (each its own shuffled order), each pass's step time the
trainer's median over the steps after its 2 warm-up steps; the figure is the median over passes, with the
passes' spread beside it. Memory: the trainer's CPU peak counts what the step allocates above what was live as
it started (``simlib.parallel.accumulate.peak_memory``), so the parameters and the optimizer's states (live
from the first step on) are not in it; they are added per rank (``simlib.debug.memory.train_counting_state``),
and the largest rank's sum is compared with the predicted memory per device (which counts them).
Run: ``python benchmarks/planner_measured.py [--world 4] [--steps 12] [--passes 2]``; writes
benchmarks/results/planner_measured.json (or planner_measured_w8.json for 8).

``--memory-only``: memory alone, which is deterministic (no quiet machine needed): no calibration (the plans are
enumerated and their memory predicted on the ``"cpu"`` preset, memory does not depend on timings), each plan
trained ``--steps`` (default 3) steps once; writes benchmarks/results/planner_memory.json (``_w8`` for 8).
"""

import argparse
import os
import random
import statistics
import time

import report  # benchmarks/report.py: machine info and the JSON file

import simlib
from simlib import sim
from simlib.debug.memory import measured_memory, train_counting_state
from simlib.dry_run import sim_model
from simlib.projects.gpt import GPTTask
from simlib.projects.runner import train_on
from simlib.sim.planner import gemm_shapes
from simlib.sim.planner_report import spearman

# the searched space: every degree layout, 1 or 4 micro-batches, recomputation on/off (ZeRO, which Gloo only
# emulates, and the overlap options are left out to keep the run to minutes; the planner prices them)
SPACE = dict(
    zero_stage=(0,),
    recompute=("none", "full"),
    schedule=("1f1b",),
    overlap=(True,),
    sequence_parallel=(False,),
    num_micro_batches=(1, 4),
)


# where the time goes, beside each step time: the planner's terms and the trainer's spans (rank 0's medians)
PREDICTED_TERMS = (
    "compute",
    "bubble",
    "optimizer",
    "exposed_comm",
    "tp_comm",
    "cp_comm",
    "pp_comm",
    "dp_exposed",
    "embedding_sync",
    "stage_idle",
    "contended_step",
    "own_core_step",
)
MEASURED_TERMS = ("forward_time", "backward_time", "optimizer_time", "comm_time", "exposed_comm_time", "wait_time")


def plan_name(plan) -> str:
    return plan.label + (" ckpt" if plan.activation_checkpointing else "")


def memory_summary(rows) -> dict:
    """Predicted over measured memory per rank: median, range and how many within 10 %."""
    ratios = [r["predicted_memory_bytes"] / r["measured_peak_bytes"] for r in rows if r["measured_peak_bytes"]]
    return dict(
        memory_ratio_median=statistics.median(ratios) if ratios else None,
        memory_ratio_range=[min(ratios), max(ratios)] if ratios else None,
        memory_ratio="predicted/measured",
        memory_within_10pct=sum(abs(x - 1) <= 0.10 for x in ratios),
        memory_target=0.10,
        memory_plans=len(ratios),
    )


def memory_only(args, task, model, load) -> None:
    """Each plan's predicted memory per rank against the measured peak, nothing timed (see the docstring)."""
    result = sim.plan(
        model, "cpu", devices=args.world, global_batch=task.global_batch, task=task, trainer_only=True, space=SPACE
    )
    rows = []
    with simlib.Cluster(args.world) as cluster:
        for e in result.ranked:
            plan = result.trainer(e)
            record, _ = train_on(
                args.world,
                task,
                plan,
                cluster=cluster,
                steps=args.steps,
                log_every=args.steps,
                warmup=1,
                verbose=False,
                train_fn=train_counting_state,
            )
            ranks = record.summary["memory_ranks"]
            rows.append(
                dict(
                    plan=plan_name(plan),
                    strategy=sim.planner.label(e["strategy"]),
                    predicted_memory_bytes=e["memory"]["total"],
                    predicted_memory=e["memory"],
                    measured_peak_bytes=measured_memory(ranks),
                    memory_ranks=ranks,
                )
            )
            r = rows[-1]
            print(
                f"{r['plan']:>28}: predicted {r['predicted_memory_bytes'] / 1e6:6.2f} MB, measured "
                f"{(r['measured_peak_bytes'] or 0) / 1e6:6.2f} MB, ratio "
                f"{r['predicted_memory_bytes'] / (r['measured_peak_bytes'] or float('nan')):.2f}",
                flush=True,
            )
    summary = memory_summary(rows)
    print(
        f"\nmemory predicted/measured median {summary['memory_ratio_median']:.3f}, "
        f"{summary['memory_within_10pct']}/{summary['memory_plans']} within 10 %"
    )
    out = dict(
        benchmark="planner_memory" + ("" if args.world == 4 else f"_w{args.world}"),
        machine=report.machine(load),
        world_size=args.world,
        steps=args.steps,
        task=dict(
            seq_len=task.seq_len,
            hidden=task.hidden,
            num_layers=task.num_layers,
            num_heads=task.num_heads,
            global_batch=task.global_batch,
        ),
        space={k: list(v) for k, v in SPACE.items()},
        summary=summary,
        rows=rows,
    )
    print(f"wrote {report.write(out)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None, help="steps per plan (default 12; 3 with --memory-only)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--memory-only", action="store_true", help="memory per rank only: no calibration, no timing")
    ap.add_argument("--save-hardware", default=None, help="pickle the calibrated Hardware here (to price plans again)")
    args = ap.parse_args()
    load = os.getloadavg()
    task = GPTTask(seq_len=64, hidden=128, num_layers=4, num_heads=4, global_batch=32)  # the project's full size
    model = sim_model(task)
    if args.memory_only:
        args.steps = args.steps or 3
        return memory_only(args, task, model, load)
    args.steps = args.steps or 12
    t0 = time.perf_counter()
    shapes = gemm_shapes(model, args.world, task.global_batch, task=task, space=SPACE)  # timed at their own shapes
    with simlib.Cluster(args.world) as cluster:
        hw = sim.calibrate(
            cluster,
            world_sizes=tuple(w for w in (1, 2, 4, 8) if w <= args.world),
            gemm_shapes=shapes,
            kernels="comm",
            timeout=600,
        )  # collectives in situ
        calibrate_s = time.perf_counter() - t0
        if args.save_hardware:
            import pickle

            with open(args.save_hardware, "wb") as f:
                pickle.dump(hw, f)
        result = sim.plan(
            model, hw, devices=args.world, global_batch=task.global_batch, task=task, trainer_only=True, space=SPACE
        )
        print(result.report(top=3))
        entries = list(result.ranked)
        times = [[] for _ in entries]
        rows = [None] * len(entries)
        for k in range(args.passes):
            order = list(range(len(entries)))
            random.Random(k).shuffle(order)
            for i in order:
                e = entries[i]
                plan = result.trainer(e)
                t = time.perf_counter()
                record, _ = train_on(
                    args.world,
                    task,
                    plan,
                    cluster=cluster,
                    steps=args.steps,
                    log_every=args.steps,
                    warmup=2,
                    verbose=False,
                    train_fn=train_counting_state,
                )
                s = record.summary
                times[i].append(s["step_time"])
                name = plan_name(plan)
                if rows[i] is None:
                    rows[i] = dict(
                        plan=name,
                        strategy=sim.planner.label(e["strategy"]),
                        predicted_rank=i + 1,
                        predicted_step_s=e["step_time"],
                        predicted_bound=e.get("shared_cores"),
                        predicted_memory_bytes=e["memory"]["total"],
                        measured_peak_bytes=measured_memory(s["memory_ranks"]),
                        memory_ranks=s["memory_ranks"],
                        step_iqr_s=[],
                        seconds=0.0,
                        loadavg=[],
                    )
                    rows[i]["predicted_terms_s"] = {k: e[k] for k in PREDICTED_TERMS if isinstance(e.get(k), float)}
                    rows[i]["measured_terms_s"] = []
                r = rows[i]
                r["measured_terms_s"].append({k: s.get(k) for k in MEASURED_TERMS})
                r["step_iqr_s"].append(s.get("step_time_iqr"))
                r["seconds"] += time.perf_counter() - t
                r["loadavg"].append(list(os.getloadavg()))
                print(
                    f"pass {k + 1} {name:>28}: predicted {e['step_time'] * 1e3:7.2f} ms, measured "
                    f"{s['step_time'] * 1e3:7.2f} ms, memory {e['memory']['total'] / 1e6:.2f} MB predicted, "
                    f"{(r['measured_peak_bytes'] or 0) / 1e6:.2f} MB measured (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        for r, ts in zip(rows, times):
            r.update(
                measured_step_s=statistics.median(ts),
                measured_step_passes_s=ts,
                measured_step_spread=(max(ts) - min(ts)) / statistics.median(ts),
            )
    pred = [r["predicted_step_s"] for r in rows]
    meas = [r["measured_step_s"] for r in rows]
    rho = spearman(pred, meas)
    best_measured = min(meas)
    first_pick = meas[0]
    mem = memory_summary(rows)
    summary = dict(
        plans=len(rows),
        spearman=rho,
        spearman_target=0.8,
        first_pick=rows[0]["plan"],
        first_pick_measured_s=first_pick,
        measured_best=rows[meas.index(best_measured)]["plan"],
        measured_best_s=best_measured,
        first_pick_over_best=first_pick / best_measured - 1,
        first_pick_target=0.10,
        **mem,
        calibrate_s=calibrate_s,
        gemm_shapes_timed=len(shapes),
        passes=args.passes,
        pass_spread_median=statistics.median(r["measured_step_spread"] for r in rows),
    )
    print(
        f"\nSpearman {rho:.3f} (target >= 0.8); first pick {rows[0]['plan']} measured {first_pick * 1e3:.2f} ms, "
        f"{first_pick / best_measured - 1:+.1%} over the measured best ({summary['measured_best']}); memory "
        f"predicted/measured median {summary['memory_ratio_median']}, {mem['memory_within_10pct']}/"
        f"{mem['memory_plans']} within 10 %"
    )
    out = dict(
        benchmark="planner_measured" + ("" if args.world == 4 else f"_w{args.world}"),
        machine=report.machine(load),
        world_size=args.world,
        steps=args.steps,
        task=dict(
            seq_len=task.seq_len,
            hidden=task.hidden,
            num_layers=task.num_layers,
            num_heads=task.num_heads,
            global_batch=task.global_batch,
        ),
        space={k: list(v) for k, v in SPACE.items()},
        refused=result.refused,
        summary=summary,
        rows=rows,
    )
    print(f"wrote {report.write(out)}")


if __name__ == "__main__":
    main()
