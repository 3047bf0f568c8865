"""Fault injection: what a reliability engineer would try on a 2-rank training run, and what happens.

Each probe injects one fault through the real stack (simlib.train, simlib.checkpoint over
torch.distributed.checkpoint, the elastic agent behind simlib.launch) and records its outcome:

    right        the run did the right thing (resumed bit-equal, fell back and said so, ran both calls, ...)
    clear error  it stopped with one line naming the cause (and the rank or step) and what to do, losing nothing
    FAIL         anything else: a hang, a silent wrong answer, a traceback wall, lost work

    python benchmarks/faults.py [--only substring] [--out benchmarks/results/faults.json]

The probes live here and in ``faults_reports.py`` (what issue 38 found: unverifiable checkpoints, two runs in one
folder, the disk estimate, task sizes, reports of a killed rank and of NaN, layout changes, class grading);
``faults_common.py`` holds what they share.

The full disk is a real one: a tmpfs mounted with a size limit (needs root; else that probe says it was skipped).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

import cloudpickle

import simlib
from simlib import checkpoint
from simlib.train import OptimConfig, Plan

import report  # benchmarks/report.py: machine info and the JSON file
from faults_common import (EVERY, OPTIM, PLANS, PROBES, STEPS, STOP, Context, _alive, _error_line, _gpt,  # noqa: F401
                           _losses, _one_line, _result, probe)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# ── probes on the warm 2-rank cluster: checkpoints ──
def _corrupt(path: Path, how: str) -> None:
    f = path / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    if how == "random bytes":
        mid = len(data) // 2
        data[mid:mid + 256] = os.urandom(256)
        f.write_bytes(bytes(data))
    elif how == "truncated":
        f.write_bytes(bytes(data[: len(data) // 3]))
    elif how == "metadata deleted":
        (path / ".metadata").unlink()
    elif how == "file deleted":
        f.unlink()


def _newest_broken(base, how):
    """Save at 3 and 6 (rank 0 breaks step 6 as `how` says), then resume to STEPS: fallback to 3, bit-equal?"""
    import torch.distributed as dist
    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    reference = _losses(Plan(dp=2), STEPS)
    _losses(plan, 6)
    if dist.get_rank() == 0:
        _corrupt(Path(base) / "step_00000006", how)
    dist.barrier()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        resumed = _losses(plan, STEPS)
    said = [str(w.message) for w in seen if issubclass(w.category, checkpoint.CheckpointFallbackWarning)]
    return dict(resumed_at=min(resumed), bit_equal=resumed == {s: reference[s] for s in resumed}, said=said)


def _all_broken(base):
    import torch.distributed as dist
    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    _losses(plan, 6)
    if dist.get_rank() == 0:
        for _, p in checkpoint.list_checkpoints(base):
            _corrupt(p, "truncated")
    dist.barrier()
    try:
        _losses(plan, STEPS)
    except checkpoint.CheckpointError as exc:
        return _error_line(exc)
    return None


def _full_disk(base, size_bytes):
    """A tmpfs with room for about 2.5 checkpoints: the third save (keep=2 plus the new one) finds the disk full."""
    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _losses(plan, STEPS)
        return dict(error=None)
    except checkpoint.CheckpointError as exc:
        left = sorted(p.name for p in Path(base).iterdir())
        return dict(error=_error_line(exc), one_line=_one_line(exc), left=left,
                    newest_verifies=checkpoint.verify(checkpoint.latest(base)) is None if checkpoint.latest(base)
                    else None)


def _read_only(base):
    try:
        _losses(Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY), STEPS)
    except checkpoint.CheckpointError as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))
    return dict(error=None)


def _nan(mode):
    from simlib import guards
    try:
        from simlib.train import train
        record = train(_gpt(), Plan(dp=2), steps=6, optim=OptimConfig(lr=1e6), verbose=False, measure_memory=False,
                       nonfinite=mode)
        return dict(skipped=record.summary["skipped_steps"])
    except guards.NonFiniteError as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))


def _changed(base, what):
    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    _losses(plan, STOP)
    task, optim, new_plan, allow = _gpt(), OPTIM, plan, ()
    if what == "data seed":
        task = _gpt(seed=1)
    elif what == "global batch":
        task = _gpt().__class__.quick(global_batch=16, eval_windows=4)
    elif what == "lr":
        optim = replace(OPTIM, lr=1e-3)
    elif what == "lr, allowed":
        optim, allow = replace(OPTIM, lr=1e-3), ("optim.lr",)
    elif what == "plan tp2 (saved dp2)":
        new_plan = Plan(tp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    try:
        from simlib.train import train
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            record = train(task, new_plan, steps=STEPS, optim=optim, log_every=1, verbose=False,
                           measure_memory=False, allow_changes=allow)
        return dict(resumed_at=record.rows[0]["step"], lr=record.rows[0]["lr"],
                    said=[str(w.message) for w in seen if "allow_changes" in str(w.message)])
    except checkpoint.CheckpointMismatch as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))


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
        out[name] = dict(resumed_at=min(resumed), bit_equal=resumed == {s: reference[s] for s in resumed},
                         attempt=ctx.restart_count)
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


for _how in ("random bytes", "truncated", "metadata deleted", "file deleted"):
    def _p(ctx, how=_how):
        out = ctx.cluster.call(_newest_broken, (ctx.dir(), how), timeout=600)[0]
        said = out["said"][0] if out["said"] else "(no message: the broken folder is not a whole checkpoint)"
        right = out["resumed_at"] == EVERY and out["bit_equal"] and (out["said"] or how == "metadata deleted")
        return _result(right, detail=f"resumed at step {out['resumed_at']}, bit-equal {out['bit_equal']}: {said}")
    probe(f"newest checkpoint {_how}")(_p)


@probe("every checkpoint truncated")
def _p_all(ctx):
    line = ctx.cluster.call(_all_broken, (ctx.dir(),), timeout=600)[0]
    return _result(ok_error=line is not None and "can be read" in line, detail=line or "trained on without a word")


@probe("full disk during a save (tmpfs)")
def _p_full(ctx):
    size = ctx.checkpoint_bytes
    mount = Path(tempfile.mkdtemp(prefix="faults-full-"))
    limit = int(size * 2.5) // 4096 * 4096
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        return dict(outcome="skipped", detail=f"cannot mount a tmpfs: {done.stderr.decode().strip()}",
                    nothing_lost=None)
    try:
        out = ctx.cluster.call(_full_disk, (str(mount / "ckpt"), limit), timeout=600)[0]
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        shutil.rmtree(mount, ignore_errors=True)
    ok = out["error"] and "full" in out["error"] and out["one_line"] and out["newest_verifies"] and \
        not any(n.endswith(".partial") for n in out["left"])
    return _result(ok_error=ok, detail=f"{out['error']} | left on disk: {out.get('left')}",
                   nothing_lost=bool(out.get("newest_verifies")), disk_bytes=limit, checkpoint_bytes=size)


@probe("read-only checkpoint directory")
def _p_ro(ctx):
    mount = Path(tempfile.mkdtemp(prefix="faults-ro-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        os.chmod(mount, 0o500)  # not root: a directory without write permission
    try:
        out = ctx.cluster.call(_read_only, (str(mount / "ckpt"),), timeout=600)[0]
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        shutil.rmtree(mount, ignore_errors=True)
    return _result(ok_error=out["error"] and out["one_line"] and "checkpoint_dir" in out["error"],
                   detail=f"{out['error']} (raised before the first step)")


@probe("lr=1e6 (loss goes inf/nan), default")
def _p_nan(ctx):
    out = ctx.cluster.call(_nan, ("stop",), timeout=600)[0]
    return _result(ok_error=out.get("error") and "step" in out["error"], detail=out.get("error", str(out)))


@probe("lr=1e6, nonfinite='skip'")
def _p_nan_skip(ctx):
    out = ctx.cluster.call(_nan, ("skip",), timeout=600)[0]
    return _result(out.get("skipped", 0) > 0, detail=f"{out.get('skipped')} step(s) skipped and counted")


for _what in ("data seed", "global batch", "lr", "plan tp2 (saved dp2)", "lr, allowed"):
    def _p(ctx, what=_what):
        out = ctx.cluster.call(_changed, (ctx.dir(), what), timeout=600)[0]
        if what == "lr, allowed":
            return _result(out.get("resumed_at") == EVERY and out.get("lr", 1) <= 1e-3 + 1e-12,
                           detail=f"resumed at {out.get('resumed_at')} with lr {out.get('lr')}: {out.get('said')}")
        return _result(ok_error=out.get("error") and out.get("one_line"), detail=out.get("error", str(out)))
    probe(f"resume with another {_what}")(_p)


@probe("a rank killed (SIGKILL) in every plan, max_restarts=1")
def _p_kill(ctx):
    base = ctx.dir()
    out = simlib.launch(_save_kill_resume, 2, base, PLANS, max_restarts=1, timeout=30)[0]
    right = all(o["bit_equal"] and o["resumed_at"] == EVERY and o["attempt"] == 1 for o in out.values())
    return _result(right, detail="; ".join(f"{k}: resumed at {o['resumed_at']}, bit-equal {o['bit_equal']}"
                                           for k, o in out.items()), plans=out)


@probe("a rank killed during a save")
def _p_kill_save(ctx):
    out = simlib.launch(_kill_during_save, 2, ctx.dir(), max_restarts=1, timeout=30)[0]
    return _result(out["bit_equal"] and out["resumed_at"] == EVERY,
                   detail=f"resumed at step {out['resumed_at']} (the save in progress was never committed), "
                          f"bit-equal {out['bit_equal']}")


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
    return _result(ok_error=ok, detail=f"{elapsed:.1f} s after the SIGSTOP: {line}",
                   seconds_to_error=round(elapsed, 1))


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
    return _result(ok, detail=f"workers left running: {orphans or 'none'}; spec with the key on disk after the "
                              f"start: {spec_left}; its folder left by the kill: {dir_after_kill}, removed at the "
                              f"next start: {not os.path.exists(log_dir)}")


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
    return _result(not errors and not hung and results == [[3.0, 3.0]] * 6,
                   detail=f"{len(results)} calls answered {results[:1]}, errors {errors}, hung {hung}")


CONCURRENT = "import simlib, torch.distributed as d\ndef f():\n    d.barrier(); return d.get_rank()\n" \
             "print(simlib.launch(f, 2))\n"


@probe("two launches at once (two processes)")
def _p_concurrent(ctx):
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    ok = all(p.returncode == 0 and "[0, 1]" in o for p, (o, _) in zip(procs, outs))
    return _result(ok, detail="; ".join(f"rc {p.returncode}: {o.strip() or e.strip()[-200:]}"
                                        for p, (o, e) in zip(procs, outs)))


BAD = {
    "OptimConfig(grad_clip=-1)": lambda: OptimConfig(grad_clip=-1),
    "OptimConfig(min_lr_ratio=-1)": lambda: OptimConfig(min_lr_ratio=-1),
    "OptimConfig(warmup_steps=-5)": lambda: OptimConfig(warmup_steps=-5),
    "OptimConfig(betas=(2, 2))": lambda: OptimConfig(betas=(2, 2)),
    "Plan(checkpoint_every=-3)": lambda: Plan(checkpoint_dir="x", checkpoint_every=-3),
    "train(steps=-5)": lambda: __import__("simlib.guards").guards.check_run_args(steps=-5),
    "Plan(dp=0)": lambda: Plan(dp=0),
    "Plan(tp=2) on a task without tensor_parallel": lambda: Plan(tp=2).validate(
        2, __import__("simlib.tasks").tasks.RegressionTask()),
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
    cases = [["train", "gpt", "--world-size", "5", "--plan", "single"], ["train", "finance", "--world-size", "3"],
             ["train", "gpt", "--world-size", "2", "--plan", "tp", "--timeout", "-1"]]
    lines, ok = [], True
    for argv in cases:
        done = subprocess.run([sys.executable, "-m", "simlib", *argv, "--quick"], capture_output=True, text=True,
                              timeout=600)
        err = done.stderr.strip().splitlines()
        ok &= done.returncode != 0 and len(err) == 1
        lines.append(f"simlib {' '.join(argv)} -> rc {done.returncode}, {len(err)} line(s): "
                     f"{err[-1] if err else ''}")
    return _result(ok_error=ok, detail=" | ".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="run the probes whose name contains this (a|b: either)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="faults-"))
    ctx = Context(root)
    rows = []
    try:
        for name, fn in PROBES:
            if args.only and not any(part in name for part in args.only.split("|")):
                continue
            t0 = time.perf_counter()
            try:
                row = fn(ctx)
            except Exception as exc:  # noqa: BLE001 - a probe that raised unexpectedly is a failure to report
                row = dict(outcome="FAIL", detail=_error_line(exc)[:600], nothing_lost=None,
                           traceback=traceback.format_exc()[-1500:])
            row = dict(probe=name, **row, seconds=round(time.perf_counter() - t0, 1))
            rows.append(row)
            print(f"{row['outcome']:12s} {name}: {row['detail'][:300]}", flush=True)
    finally:
        ctx.cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("right", "clear error", "FAIL", "skipped")}
    result = dict(benchmark="faults", world_size=2, probes=rows, counts=counts,
                  all_right_or_clear=counts["FAIL"] == 0,
                  machine=report.machine(load_before, shared="yes: up to 8 helpers on 2 cores"))
    path = report.write(result, args.out)
    print(f"\n{counts}; wrote {path}")


import faults_reports  # noqa: E402,F401 - the probes of issue 38, after these (they register themselves)

if __name__ == "__main__":
    main()
