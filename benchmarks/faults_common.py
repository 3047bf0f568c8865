"""What the fault probes share (``benchmarks/faults.py`` runs them): the run they perturb, the probe registry, the
outcome of a probe, and the warm 2-rank cluster they run on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle

import simlib
from simlib import checkpoint
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EVERY, STOP, STEPS = 3, 5, 8
OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, decay_steps=STEPS, grad_clip=1.0, weight_decay=0.1)
PLANS = {
    "dp2": Plan(dp=2),
    "tp2": Plan(tp=2),
    "pp2": Plan(pp=2, accumulation=2),
    "zero1": Plan(dp=2, zero_stage=1),
    "zero2": Plan(dp=2, zero_stage=2),
    "zero3": Plan(dp=2, zero_stage=3),
}


def _gpt(**kw):
    from simlib.projects.gpt.task import GPTTask

    return GPTTask.quick(global_batch=8, eval_windows=4, **kw)


def _losses(plan, steps, task=None, **kw):
    from simlib.train import train

    record = train(
        task or _gpt(),
        plan,
        steps=steps,
        optim=kw.pop("optim", OPTIM),
        log_every=1,
        verbose=False,
        measure_memory=False,
        **kw,
    )
    return {r["step"]: r["loss"] for r in record.rows}


def _error_line(exc) -> str:
    text = " ".join(str(exc).split()) if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text[:400]}"


def _one_line(exc) -> bool:
    return "\n" not in str(exc).strip() and len(str(exc)) > 0


# ── the probes ──
PROBES = []


def probe(name):
    def add(fn):
        PROBES.append((name, fn))
        return fn

    return add


def _result(ok_right=None, ok_error=None, detail="", nothing_lost=True, **extra):
    outcome = "right" if ok_right else "clear error" if ok_error else "FAIL"
    return dict(outcome=outcome, detail=detail, nothing_lost=nothing_lost, **extra)


def _alive(pid):
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Context:
    def __init__(self, root):
        self.root, self.n = Path(root), 0
        self.cluster = simlib.Cluster(2, timeout=30)
        self.checkpoint_bytes = self.cluster.call(_checkpoint_bytes, (self.dir(),), timeout=600)[0]

    def dir(self) -> str:
        self.n += 1
        return str(self.root / f"p{self.n:02d}")


def _checkpoint_bytes(base):
    _losses(Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY), EVERY)
    return sum(f.stat().st_size for f in checkpoint.latest(base).rglob("*") if f.is_file())
