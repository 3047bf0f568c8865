"""Fault probes on processes (run by ``benchmarks/faults.py``): a rank killed (SIGKILL) in every plan and during a
save, with restarts; a rank stopped (SIGSTOP); the parent killed; one cluster called from two threads; two
launches at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import cloudpickle
from faults_common import (
    EVERY,
    PLANS,
    STEPS,
    STOP,
    _alive,
    _error_line,
    _gpt,
    _losses,
    _result,
    probe,
)

import simlib
from simlib.train import Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _save_kill_resume(base, plans):
    """Every plan saves (every 3 steps) and stops at step 5; the last one instead loses rank 1 (SIGKILL) at step 5.
    The restarted workers resume every plan and compare with a clean run."""
    from simlib.faults import KillAt

    ctx = simlib.init()
    names = list(plans)
    if ctx.restart_count == 0:
        for name in names:
            plan = replace(plans[name], checkpoint_dir=os.path.join(base, name), checkpoint_every=EVERY)
            if name == names[-1]:
                _losses(plan, STEPS, task=KillAt(_gpt(), step=STOP, rank=1))
            _losses(plan, STOP)
    out = {}
    for name in names:
        plan = replace(plans[name], checkpoint_dir=os.path.join(base, name), checkpoint_every=EVERY)
        resumed, reference = _losses(plan, STEPS), _losses(plans[name], STEPS)
        out[name] = dict(
            resumed_at=min(resumed), bit_equal=resumed == {s: reference[s] for s in resumed}, attempt=ctx.restart_count
        )
    return out


def _kill_during_save(base):
    from simlib.faults import KillAt

    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    resumed = _losses(plan, STEPS, task=KillAt(_gpt(), step=4, rank=1, during_save=True))
    reference = _losses(Plan(dp=2), STEPS)
    return dict(resumed_at=min(resumed), bit_equal=resumed == {s: reference[s] for s in resumed})


def _sigstop(stamp):
    import torch.distributed as dist

    ctx = simlib.init()
    _losses(Plan(tp=2), 1)  # warm on both ranks
    dist.barrier()
    if ctx.rank == 1:
        with open(stamp, "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return _losses(Plan(tp=2), 4)


def _value():
    import torch
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t)


@probe("a rank killed (SIGKILL) in every plan, max_restarts=1")
def _p_kill(ctx):
    base = ctx.dir()
    out = simlib.launch(_save_kill_resume, 2, base, PLANS, max_restarts=1, timeout=30)[0]
    right = all(o["bit_equal"] and o["resumed_at"] == EVERY and o["attempt"] == 1 for o in out.values())
    return _result(
        right,
        detail="; ".join(f"{k}: resumed at {o['resumed_at']}, bit-equal {o['bit_equal']}" for k, o in out.items()),
        plans=out,
    )


@probe("a rank killed during a save")
def _p_kill_save(ctx):
    out = simlib.launch(_kill_during_save, 2, ctx.dir(), max_restarts=1, timeout=30)[0]
    return _result(
        out["bit_equal"] and out["resumed_at"] == EVERY,
        detail=f"resumed at step {out['resumed_at']} (the save in progress was never committed), "
        f"bit-equal {out['bit_equal']}",
    )


@probe("a rank stopped (SIGSTOP), timeout=5")
def _p_stop(ctx):
    cluster = simlib.Cluster(2, timeout=5, grace=2)
    stamp = Path(ctx.dir() + ".stopped_at")
    try:
        cluster.call(_sigstop, (str(stamp),), timeout=300)
        line = None
    except simlib.WorkerError as exc:
        line = str(exc).splitlines()[0]
    finally:
        cluster.close()
    elapsed = time.time() - float(stamp.read_text()) if stamp.exists() else float("nan")
    ok = line is not None and "rank 1 was stopped" in line
    return _result(ok_error=ok, detail=f"{elapsed:.1f} s after the SIGSTOP: {line}", seconds_to_error=round(elapsed, 1))


PARENT = """
import os, sys, time, simlib
c = simlib.Cluster(2)
print(os.getpid(), *c.pids, c._log_dir, flush=True)
time.sleep(600)
"""


@probe("the parent killed (SIGKILL)")
def _p_parent(ctx):
    p = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    parent, w0, w1, log_dir = p.stdout.readline().split()
    spec_left = os.path.exists(os.path.join(log_dir, "spec.json"))
    os.kill(int(parent), signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(int(w)) for w in (w0, w1)):
        time.sleep(0.2)
    orphans = [w for w in (w0, w1) if _alive(int(w))]
    dir_after_kill = os.path.exists(log_dir)
    from simlib.agent import _remove_stale_dirs

    _remove_stale_dirs()  # what the next Cluster's start does
    ok = not orphans and not spec_left and not os.path.exists(log_dir)
    return _result(
        ok,
        detail=f"workers left running: {orphans or 'none'}; spec with the key on disk after the "
        f"start: {spec_left}; its folder left by the kill: {dir_after_kill}, removed at the "
        f"next start: {not os.path.exists(log_dir)}",
    )


@probe("one Cluster called from two threads")
def _p_threads(ctx):
    results, errors = [], []

    def caller():
        try:
            for _ in range(3):
                results.append(ctx.cluster.run(_value))
        except Exception as exc:  # noqa: BLE001
            errors.append(_error_line(exc))

    ts = [threading.Thread(target=caller) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    hung = any(t.is_alive() for t in ts)
    return _result(
        not errors and not hung and results == [[3.0, 3.0]] * 6,
        detail=f"{len(results)} calls answered {results[:1]}, errors {errors}, hung {hung}",
    )


CONCURRENT = (
    "import simlib, torch.distributed as d\ndef f():\n    d.barrier(); return d.get_rank()\n"
    "print(simlib.launch(f, 2))\n"
)


@probe("two launches at once (two processes)")
def _p_concurrent(ctx):
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    ok = all(p.returncode == 0 and "[0, 1]" in o for p, (o, _) in zip(procs, outs))
    return _result(
        ok, detail="; ".join(f"rc {p.returncode}: {o.strip() or e.strip()[-200:]}" for p, (o, e) in zip(procs, outs))
    )
