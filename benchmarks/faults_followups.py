"""The fault probes of issue 51 (run by ``benchmarks/faults.py``): what the earlier probes still found open. A batch
part of the wrong size on one rank, and ``simlib train`` losing rank 0 to a SIGKILL (its one line must lead with
the rank that died). The small disk is in ``faults_checkpoints.py``, a NaN from one rank's data in
``faults_reports.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
from faults_common import _losses, _result, probe

from simlib.train import Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


class _Rows9:
    """The regression task, but rank 1's part of global batch 1 has 9 rows where 8 were declared."""

    def __init__(self):
        from simlib.tasks import RegressionTask

        self.task = RegressionTask(width=16, depth=2, global_batch=16, num_samples=128)

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step, part=0, parts=1):
        import torch

        x, y = self.task.batch(step, part=part, parts=parts)
        return (torch.cat([x, x[:1]]), torch.cat([y, y[:1]])) if part == 1 and step == 1 else (x, y)


def _rows9(plan):
    t0 = time.monotonic()
    try:
        _losses(plan, 3, task=_Rows9())
        return None, time.monotonic() - t0
    except ValueError as exc:
        return str(exc), time.monotonic() - t0


@probe("a batch part of 9 rows where 8 were declared, on rank 1 only (dp2; dp2 with 2 micro-batches)")
def _p_rows9(ctx):
    lines, ok = [], True
    for name, plan in (("dp2", Plan(dp=2)), ("dp2 accumulation 2", Plan(dp=2, accumulation=2))):
        outs = ctx.cluster.call(_rows9, (plan,), timeout=600)
        said = [o[0] for o in outs]
        ok &= all(s and "rank 1, step 1" in s and "9 inputs rows where 8" in s and "\n" not in s for s in said)
        lines.append(f"{name}: every rank raised in {max(o[1] for o in outs):.1f} s: {said[0]}")
    return _result(ok_error=ok, detail=" | ".join(lines))


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        found.append(int(d))
                        stack.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _rank0(pid: int) -> int | None:
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"RANK=0" in env and b"LOCAL_RANK=0" in env:
            return child
    return None


@probe("`simlib train gpt` at 2 ranks, rank 0 killed (SIGKILL) mid-run: its one line")
def _p_cli_rank0(ctx):
    out = Path(tempfile.mkdtemp(prefix="faults-cli-"))
    argv = ["train", "gpt", "--quick", "--world-size", "2", "--out", str(out), "--budget.seconds", "600"]
    run = subprocess.Popen(
        [sys.executable, "-m", "simlib", *argv, "--budget.tokens", "null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "SIMLIB_QUICK": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(out.rglob("run.jsonl")) and run.poll() is None:
            time.sleep(0.5)
        victim = _rank0(run.pid)
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
        err = run.communicate(timeout=300)[1].strip().splitlines()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    line = err[-1] if err else ""
    ok = victim is not None and len(err) == 1 and line.startswith("simlib train: rank 0 died first")
    return _result(ok_error=ok, detail=f"rc {run.returncode}, {len(err)} line(s): {line}")
