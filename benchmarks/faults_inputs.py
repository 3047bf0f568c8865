"""Fault probes on inputs (run by ``benchmarks/faults.py``): a loss that goes inf/NaN (stopped, or skipped and
counted), bad arguments to the library and to the command line, and a batch of the wrong size."""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
from faults_common import (
    _error_line,
    _gpt,
    _losses,
    _one_line,
    _result,
    probe,
)

from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _nan(mode):
    from simlib import guards

    try:
        from simlib.train import train

        record = train(
            _gpt(), Plan(dp=2), steps=6, optim=OptimConfig(lr=1e6), verbose=False, measure_memory=False, nonfinite=mode
        )
        return dict(skipped=record.summary["skipped_steps"])
    except guards.NonFiniteError as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))


@probe("lr=1e6 (loss goes inf/nan), default")
def _p_nan(ctx):
    out = ctx.cluster.call(_nan, ("stop",), timeout=600)[0]
    return _result(ok_error=out.get("error") and "step" in out["error"], detail=out.get("error", str(out)))


@probe("lr=1e6, nonfinite='skip'")
def _p_nan_skip(ctx):
    out = ctx.cluster.call(_nan, ("skip",), timeout=600)[0]
    return _result(out.get("skipped", 0) > 0, detail=f"{out.get('skipped')} step(s) skipped and counted")


BAD = {
    "OptimConfig(grad_clip=-1)": lambda: OptimConfig(grad_clip=-1),
    "OptimConfig(min_lr_ratio=-1)": lambda: OptimConfig(min_lr_ratio=-1),
    "OptimConfig(warmup_steps=-5)": lambda: OptimConfig(warmup_steps=-5),
    "OptimConfig(betas=(2, 2))": lambda: OptimConfig(betas=(2, 2)),
    "Plan(checkpoint_every=-3)": lambda: Plan(checkpoint_dir="x", checkpoint_every=-3),
    "train(steps=-5)": lambda: __import__("simlib.guards").guards.check_run_args(steps=-5),
    "Plan(dp=0)": lambda: Plan(dp=0),
    "Plan(tp=2) on a task without tensor_parallel": lambda: Plan(tp=2).validate(
        2, __import__("simlib.tasks").tasks.RegressionTask()
    ),
}


@probe("bad arguments (library)")
def _p_bad(ctx):
    lines = {}
    for name, make in BAD.items():
        try:
            make()
            lines[name] = "accepted"
        except ValueError as exc:
            lines[name] = _error_line(exc) if _one_line(exc) else "MULTI-LINE: " + _error_line(exc)
    ok = all(v != "accepted" and not v.startswith("MULTI") for v in lines.values())
    return _result(ok_error=ok, detail=" | ".join(f"{k} -> {v}" for k, v in lines.items()))


def _rows17():
    from simlib.tasks import RegressionTask

    class Rows17(RegressionTask):
        def batch(self, step):
            import torch

            x, y = super().batch(step)
            return torch.cat([x, x[:1]]), torch.cat([y, y[:1]])

    try:
        _losses(Plan(dp=2), 2, task=Rows17(global_batch=16))
    except ValueError as exc:
        return _error_line(exc)
    return None


@probe("a batch of 17 rows where 16 were declared, dp=2")
def _p_rows(ctx):
    line = ctx.cluster.call(_rows17, timeout=300)[0]
    return _result(ok_error=line is not None and "17" in line, detail=line or "trained on without a word")


@probe("bad arguments (command line)")
def _p_cli(ctx):
    cases = [
        ["train", "gpt", "--world-size", "5", "--plan", "single"],
        ["train", "finance", "--world-size", "3"],
        ["train", "gpt", "--world-size", "2", "--plan", "tp", "--timeout", "-1"],
    ]
    lines, ok = [], True
    for argv in cases:
        done = subprocess.run(
            [sys.executable, "-m", "simlib", *argv, "--quick"], capture_output=True, text=True, timeout=600
        )
        err = done.stderr.strip().splitlines()
        ok &= done.returncode != 0 and len(err) == 1
        lines.append(f"simlib {' '.join(argv)} -> rc {done.returncode}, {len(err)} line(s): {err[-1] if err else ''}")
    return _result(ok_error=ok, detail=" | ".join(lines))
