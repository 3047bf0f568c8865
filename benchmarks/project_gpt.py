"""The GPT project's costs: tokens/s per plan, the trainer's overhead, time to a target eval loss.

    python benchmarks/project_gpt.py            # full-size model (0.93 M parameters), ~15 min on 2 idle cores

1. tokens/s (median step, warm-up left out) at 1 process x 1 thread, 1 process x 2 threads, 2-process DP,
   2-way TP, 2-stage 1F1B pipeline (4 micro-batches); one thread per process unless said.
2. the trainer's overhead: ``simlib.train`` against a bare hand-written loop (same model, batches, AdamW,
   clipping), one process x 1 thread, alternating rounds so that load drifts hit both; target <= 5 %.
3. training time to eval loss <= 5.0 nats (evaluated every 10 steps, evaluation time left out): 1 process x
   1 thread against 2-process DP (target >= 1.6x; ~1.76x is the compute-bound ceiling of this box), beside
   1 process x 2 threads.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

STEPS, WARMUP, ROUNDS = 20, 3, 3
TARGET = {"eval_loss": 5.0}


def bare_steps(steps: int) -> list[float]:
    """A hand-written loop on the project's model: no trainer, no timeline, no logging. Step times (s)."""
    import torch

    from simlib.projects.gpt import run as project_gpt

    cfg = project_gpt.settings(quick=False)
    task, optim = cfg["task"], cfg["optim"]
    model = task.build_model()
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [
            dict(params=[p for p in params if p.dim() >= 2], weight_decay=optim.weight_decay),
            dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0),
        ],
        lr=optim.lr,
        betas=optim.betas,
    )
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = task.batch(step)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def trainer_run(plan, steps=STEPS, **kwargs) -> dict:
    """The project's settings through ``simlib.train`` (call on every rank); returns the summary."""
    from simlib.projects.gpt import run as project_gpt
    from simlib.train import train

    cfg = {
        **project_gpt.settings(quick=False),
        "steps": steps,
        "eval_every": 0,
        "log_every": 10,
        "verbose": False,
        "measure_memory": False,
        "warmup": WARMUP,
        **kwargs,
    }
    task = cfg.pop("task")
    return train(task, plan, **cfg).summary


def overhead_rounds(rounds: int = ROUNDS) -> dict:
    """Bare loop and trainer alternately in one process; per round the medians of the measured steps."""
    from simlib.train import Plan

    bare, trainer = [], []
    for _ in range(rounds):
        bare.append(statistics.median(bare_steps(STEPS)[WARMUP:]))
        trainer.append(trainer_run(Plan())["step_time"])
    return {"bare_step_s": bare, "trainer_step_s": trainer}


def overhead_verdict(rounds: dict, max_drift: float = 1.2) -> dict:
    """The median trainer/bare ratio over rounds, and whether it can be trusted: when the bare loop's own step
    time moved by more than ``max_drift`` between rounds (a loaded machine), a 5 % effect cannot be seen."""
    ratios = [t / b for t, b in zip(rounds["trainer_step_s"], rounds["bare_step_s"])]
    ratio = statistics.median(ratios)
    drift = max(rounds["bare_step_s"]) / min(rounds["bare_step_s"])
    out = {**rounds, "ratios": ratios, "trainer_over_bare_median": ratio, "bare_drift": drift, "target": "<= 1.05"}
    if drift > max_drift:
        out.update(
            met=None,
            verdict=f"inconclusive: the bare loop's step time itself varied {drift:.2f}x between "
            "rounds (machine load), more than the 5 % to be resolved",
        )
    else:
        out.update(met=ratio <= 1.05, verdict="met" if ratio <= 1.05 else "missed")
    return out


def to_target(plan) -> dict:
    s = trainer_run(plan, steps=600, eval_every=10, target=TARGET, stop_at_target=True)
    return {
        k: s.get(k)
        for k in (
            "time_to_target",
            "tokens_to_target",
            "step_to_target",
            "target_reached",
            "tokens_per_s",
            "threads",
            "world_size",
        )
    }


def main() -> dict:
    import simlib
    from simlib.train import Plan

    load_before = os.getloadavg()
    out = {"benchmark": "project_gpt", "target": TARGET, "steps": STEPS, "warmup": WARMUP}
    runs = {
        "1x1 thread": (Plan(), 1),
        "1x2 threads": (Plan(), 2),
        "2-proc DP": (Plan(dp=2), 1),
        "2-way TP": (Plan(tp=2), 1),
        "2-stage PP": (Plan(pp=2, pp_microbatches=4), 1),
    }
    out["tokens_per_s"], out["step_time_iqr_s"] = {}, {}
    for label, (plan, threads) in runs.items():
        s = simlib.launch(trainer_run, plan.world_size, plan, threads=threads)[0]
        out["tokens_per_s"][label], out["step_time_iqr_s"][label] = s["tokens_per_s"], s["step_time_iqr"]
        print(
            f"{label:12s} {s['tokens_per_s']:8.0f} tokens/s  (step {s['step_time'] * 1e3:.0f} ms, "
            f"IQR {s['step_time_iqr'] * 1e3:.0f} ms)",
            flush=True,
        )
    rounds = simlib.launch(overhead_rounds, 1, threads=1)[0]
    out["overhead"] = overhead_verdict(rounds)
    ratio = out["overhead"]["trainer_over_bare_median"]
    print(f"trainer / bare loop: {ratio:.3f} (rounds {rounds})", flush=True)
    ttt = {}
    for label, (plan, threads) in {
        "1x1 thread": (Plan(), 1),
        "2-proc DP": (Plan(dp=2), 1),
        "1x2 threads": (Plan(), 2),
    }.items():
        ttt[label] = simlib.launch(to_target, plan.world_size, plan, threads=threads)[0]
        print(f"{label:12s} time to eval loss {TARGET['eval_loss']}: {ttt[label]['time_to_target']} s", flush=True)
    out["time_to_target"] = ttt
    if all(v["time_to_target"] for v in ttt.values()):
        base = ttt["1x1 thread"]["time_to_target"]
        out["speedup_to_target"] = {k: base / v["time_to_target"] for k, v in ttt.items()}
        out["speedup_target"] = ">= 1.6 (2-proc DP vs 1x1 thread)"
        out["speedup_met"] = out["speedup_to_target"]["2-proc DP"] >= 1.6
    out["machine"] = report.machine(load_before)
    load = max(load_before[0], out["machine"]["loadavg_after"][0])
    if load > 2 * out["machine"]["cores"]:
        out["note"] = (
            f"load average {load:.0f} on {out['machine']['cores']} cores while measuring (other jobs): "
            "timings are dominated by contention and do not test the targets; rerun on an idle machine"
        )
    path = report.write(out)
    print(f"wrote {path}; load average before {load_before[0]:.1f}, after {out['machine']['loadavg_after'][0]:.1f}")
    return out


if __name__ == "__main__":
    main()
