"""Fault probes on checkpoints (run by ``benchmarks/faults.py``): a newest checkpoint broken four ways, every one
truncated, a full disk during a save and at start, a read-only folder, and a resume with another task, plan or
optimizer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import cloudpickle
from faults_common import (
    EVERY,
    OPTIM,
    STEPS,
    STOP,
    _error_line,
    _gpt,
    _losses,
    _one_line,
    _result,
    probe,
)

from simlib import checkpoint
from simlib.train import Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _corrupt(path: Path, how: str) -> None:
    f = path / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    if how == "random bytes":
        mid = len(data) // 2
        data[mid : mid + 256] = os.urandom(256)
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


class _FillAt:
    """The task, but at step ``step`` rank 0 writes a file that leaves ``room`` bytes free on the checkpoints' disk
    (another program filling it while the run trains: the preflight at start had found room)."""

    def __init__(self, task, step, base, room):
        self.task, self.step, self.base, self.room = task, step, base, room

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step, part=0, parts=1):
        if step == self.step and part == 0:
            free = shutil.disk_usage(self.base).free
            with open(Path(self.base).parent / "ballast", "wb") as f:
                f.write(b"\0" * max(0, free - self.room))
        return self.task.batch(step, part=part, parts=parts)


def _full_disk(base, size_bytes, at_start):
    """``at_start``: a tmpfs with room for about 2.5 checkpoints, where a run that saves every step needs 3 (keep=2
    plus the new one): refused before any step. Else a roomy tmpfs that another program fills at step 2, leaving
    half a checkpoint: the next save finds the disk full."""
    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _losses(plan, STEPS, task=None if at_start else _FillAt(_gpt(), 2, base, size_bytes // 2))
        return dict(error=None)
    except checkpoint.CheckpointError as exc:
        left = sorted(p.name for p in Path(base).iterdir() if p.name.startswith("step_"))
        return dict(
            error=_error_line(exc),
            one_line=_one_line(exc),
            left=left,
            newest_verifies=checkpoint.verify(checkpoint.latest(base)) is None if checkpoint.latest(base) else None,
        )


def _read_only(base):
    try:
        _losses(Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY), STEPS)
    except checkpoint.CheckpointError as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))
    return dict(error=None)


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
            record = train(
                task,
                new_plan,
                steps=STEPS,
                optim=optim,
                log_every=1,
                verbose=False,
                measure_memory=False,
                allow_changes=allow,
            )
        return dict(
            resumed_at=record.rows[0]["step"],
            lr=record.rows[0]["lr"],
            said=[str(w.message) for w in seen if "allow_changes" in str(w.message)],
        )
    except checkpoint.CheckpointMismatch as exc:
        return dict(error=_error_line(exc), one_line=_one_line(exc))


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


def _tmpfs_run(ctx, room: float, at_start: bool):
    size = ctx.checkpoint_bytes
    mount = Path(tempfile.mkdtemp(prefix="faults-full-"))
    limit = int(size * room) // 4096 * 4096
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        return None, f"cannot mount a tmpfs: {done.stderr.decode().strip()}", limit
    try:
        return ctx.cluster.call(_full_disk, (str(mount / "ckpt"), size, at_start), timeout=600)[0], "", limit
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        shutil.rmtree(mount, ignore_errors=True)


@probe("full disk during a save (tmpfs filled by another program at step 2)")
def _p_full(ctx):
    out, skipped, limit = _tmpfs_run(ctx, 4.5, at_start=False)
    if out is None:
        return dict(outcome="skipped", detail=skipped, nothing_lost=None)
    ok = (
        out["error"]
        and "full" in out["error"]
        and out["one_line"]
        and out["newest_verifies"]
        and not any(n.endswith(".partial") for n in out["left"])
    )
    return _result(
        ok_error=ok,
        detail=f"{out['error']} | left on disk: {out.get('left')}",
        nothing_lost=bool(out.get("newest_verifies")),
        disk_bytes=limit,
        checkpoint_bytes=ctx.checkpoint_bytes,
    )


@probe("a small disk: room for 2.5 checkpoints where rotation needs 3 (tmpfs)")
def _p_small(ctx):
    out, skipped, limit = _tmpfs_run(ctx, 2.5, at_start=True)
    if out is None:
        return dict(outcome="skipped", detail=skipped, nothing_lost=None)
    ok = out["error"] and "while 3 are on disk" in out["error"] and out["one_line"] and not out["left"]
    return _result(
        ok_error=ok,
        detail=f"{out['error']} | left on disk: {out.get('left')} (refused before any step)",
        disk_bytes=limit,
        checkpoint_bytes=ctx.checkpoint_bytes,
    )


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
    return _result(
        ok_error=out["error"] and out["one_line"] and "checkpoint_dir" in out["error"],
        detail=f"{out['error']} (raised before the first step)",
    )


for _what in ("data seed", "global batch", "lr", "plan tp2 (saved dp2)", "lr, allowed"):

    def _p(ctx, what=_what):
        out = ctx.cluster.call(_changed, (ctx.dir(), what), timeout=600)[0]
        if what == "lr, allowed":
            return _result(
                out.get("resumed_at") == EVERY and out.get("lr", 1) <= 1e-3 + 1e-12,
                detail=f"resumed at {out.get('resumed_at')} with lr {out.get('lr')}: {out.get('said')}",
            )
        return _result(ok_error=out.get("error") and out.get("one_line"), detail=out.get("error", str(out)))

    probe(f"resume with another {_what}")(_p)
