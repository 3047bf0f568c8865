"""The fault probes of issue 38 (run by ``benchmarks/faults.py``): a checkpoint that cannot be verified, two runs on
one checkpoint folder, the disk estimate against what a save writes, task sizes of 0, a rank killed during a save,
NaN on one rank, layout changes at resume, and class grading (a submission that kills the grader; processes that
clear their environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import cloudpickle
from faults_common import EVERY, STEPS, _error_line, _gpt, _losses, _one_line, _result, probe

import simlib
from simlib import checkpoint
from simlib.train import Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _simlib(*argv, timeout=600, **kw):
    return subprocess.run(
        [sys.executable, "-m", "simlib", *argv], capture_output=True, text=True, timeout=timeout, env=ENV, **kw
    )


# ── 1. no manifest, random bytes ──
def _unverifiable(base):
    import torch.distributed as dist

    plan = Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    reference = _losses(Plan(dp=2), STEPS)
    _losses(plan, 6)
    if dist.get_rank() == 0:
        newest = Path(base) / "step_00000006"
        (newest / "manifest.json").unlink()
        f = newest / "__0_0.distcp"
        data = bytearray(f.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 256] = os.urandom(256)
        f.write_bytes(bytes(data))
    dist.barrier()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        resumed = _losses(plan, STEPS)
    said = [str(w.message) for w in seen if issubclass(w.category, checkpoint.CheckpointFallbackWarning)]
    return dict(resumed_at=min(resumed), bit_equal=resumed == {s: reference[s] for s in resumed}, said=said)


@probe("newest checkpoint: manifest deleted and random bytes in a shard")
def _p_unverifiable(ctx):
    out = ctx.cluster.call(_unverifiable, (ctx.dir(),), timeout=600)[0]
    said = out["said"][0] if out["said"] else "(no message)"
    return _result(
        out["resumed_at"] == EVERY and out["bit_equal"] and bool(out["said"]),
        detail=f"resumed at step {out['resumed_at']}, bit-equal {out['bit_equal']}: {said}",
    )


# ── 2. two runs, one folder ──
@probe("a second `simlib train` on the same checkpoint folder, no --resume")
def _p_two_runs(ctx):
    folder = Path(ctx.dir())
    common = [
        "train",
        "gpt",
        "--quick",
        "--world-size",
        "2",
        "--plan.checkpoint-dir",
        str(folder),
        "--plan.checkpoint-every",
        "2",
    ]
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simlib",
            *common,
            "--out",
            str(folder.parent / "first"),
            "--budget.seconds",
            "600",
            "--budget.tokens",
            "null",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not checkpoint.list_checkpoints(folder) and first.poll() is None:
            time.sleep(1)
        started = bool(checkpoint.list_checkpoints(folder))
        second = _simlib(*common, "--out", str(folder.parent / "second"))
        first_alive = first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    err = second.stderr.strip().splitlines()
    ok = started and first_alive and second.returncode != 0 and len(err) == 1 and "in use by another run" in err[0]
    return _result(
        ok_error=ok,
        detail=f"first run saving: {started}, still running after the second: {first_alive}; "
        f"second: rc {second.returncode}, {len(err)} line(s): {err[-1] if err else ''}"
        + ("" if started else f" | first: {first.stderr.read()[-300:]}"),
    )


# ── 3. the disk estimate against what a save writes ──
def _estimate(base, plan):
    import simlib.checkpoint as c

    seen, preflight = [], c.preflight
    c.preflight = lambda *a, **k: seen.append(preflight(*a, **k)) or seen[-1]
    try:
        _losses(replace(plan, checkpoint_dir=base, checkpoint_every=EVERY), EVERY)
    finally:
        c.preflight = preflight
    newest = checkpoint.latest(base)
    return seen[0], sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())


@probe("disk estimate against the bytes a save writes (dp2, tp2, zero1)")
def _p_estimate(ctx):
    figures = {}
    for name, plan in (("dp2", Plan(dp=2)), ("tp2", Plan(tp=2)), ("zero1", Plan(dp=2, zero_stage=1))):
        estimate, written = ctx.cluster.call(_estimate, (ctx.dir(), plan), timeout=600)[0]
        figures[name] = dict(estimate=estimate, written=written, ratio=round(estimate / written, 4))
    ok = all(f["estimate"] >= f["written"] for f in figures.values())
    return _result(
        ok,
        detail="; ".join(
            f"{k}: estimated {f['estimate']:,} B, written {f['written']:,} B (x{f['ratio']})"
            for k, f in figures.items()
        ),
        figures=figures,
    )


# ── 4. task sizes of 0 ──
@probe("task sizes of 0 (command line, three projects)")
def _p_task_sizes(ctx):
    cases = [
        ("gpt", "--task.eval-windows"),
        ("gpt", "--task.seq-len"),
        ("gpt", "--task.hidden"),
        ("gpt", "--task.global-batch"),
        ("vision", "--task.width"),
        ("finance", "--task.days"),
    ]
    lines, ok = [], True
    with tempfile.TemporaryDirectory() as out:
        for project, flag in cases:
            done = _simlib("train", project, "--quick", "--world-size", "1", flag, "0", "--out", out, cwd=out)
            err = done.stderr.strip().splitlines()
            ok &= done.returncode != 0 and len(err) == 1 and "step" not in done.stdout
            lines.append(f"{project} {flag} 0 -> rc {done.returncode}, {len(err)} line(s): {err[-1] if err else ''}")
    return _result(ok_error=ok, detail=" | ".join(lines))


# ── 5. a rank killed during a save ──
def _die_in_save(base, rank):
    from simlib.faults import KillAt

    _losses(
        Plan(dp=2, checkpoint_dir=base, checkpoint_every=EVERY),
        STEPS,
        task=KillAt(_gpt(), step=2, rank=rank, during_save=True),
    )


@probe("a rank killed during a save, no restart: what is said")
def _p_dead_rank(ctx):
    details, ok = [], True
    for rank in (0, 1):
        base = ctx.dir()
        try:
            simlib.launch(_die_in_save, 2, base, rank, max_restarts=0, timeout=10)
            text = "no error"
        except simlib.WorkerError as exc:
            text = str(exc)
        lines = text.splitlines()
        partial = list(Path(base).glob("*.partial"))
        truthful = not (("partial folder was removed" in text and partial) or ("still on disk" in text and not partial))
        named = len(lines) > 1 and f"rank {rank} died first" in lines[0] and lines[1].startswith(f"rank {rank}: ")
        ok &= named and truthful and "look at what they did instead" not in text
        details.append(
            f"rank {rank} killed: {lines[0] if lines else ''} / {lines[1][:200] if len(lines) > 1 else ''}"
            f" / on disk: {[p.name for p in partial]}"
        )
    return _result(ok_error=ok, detail=" | ".join(details))


# ── 6. NaN on one rank ──
class NaNOnRank1:
    """The GPT task, but rank 1's loss at step 2 is NaN (as a poisoned row of its data would make it)."""

    def __init__(self):
        self.task, self.step = _gpt(), -1

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step, part=0, parts=1):
        self.step = step
        return self.task.batch(step, part=part, parts=parts)

    def loss(self, output, target):
        import torch.distributed as dist

        loss = self.task.loss(output, target)
        return loss * float("nan") if dist.get_rank() == 1 and self.step == 2 else loss


def _nan_on_rank1():
    from simlib import guards

    try:
        _losses(Plan(dp=2), 4, task=NaNOnRank1())
    except guards.NonFiniteError as exc:
        return _error_line(exc)
    return None


@probe("NaN loss on rank 1 only, grad_clip set")
def _p_nan_rank(ctx):
    line = ctx.cluster.call(_nan_on_rank1, timeout=600)[0]
    ok = line is not None and "task.batch(2) on rank 1" in line and "grad_clip (now" not in line  # its data
    return _result(ok_error=ok, detail=line or "trained on without a word")


# ── 7. layout changes ──
def _layouts(base):
    out = {}
    for saved, now in ((Plan(tp=2), Plan(dp=2)), (Plan(dp=2), Plan(dp=2, zero_stage=1))):
        folder = os.path.join(base, saved.label.replace(" ", "_"))
        _losses(replace(saved, checkpoint_dir=folder, checkpoint_every=EVERY), EVERY)
        for allow in ((), ("*",)):
            try:
                _losses(replace(now, checkpoint_dir=folder), STEPS, allow_changes=allow)
                out[f"{saved.label} -> {now.label}, allow {allow}"] = "resumed"
            except (checkpoint.CheckpointMismatch, ValueError) as exc:
                out[f"{saved.label} -> {now.label}, allow {allow}"] = _error_line(exc) + (
                    "" if _one_line(exc) else " (MULTI-LINE)"
                )
    return out


@probe("layout changes at resume (tp2 -> dp2, dp2 -> zero1), with and without allow_changes")
def _p_layouts(ctx):
    out = ctx.cluster.call(_layouts, (ctx.dir(),), timeout=600)[0]
    ok = all("CheckpointMismatch" in v and "allow_changes" not in v and "saved layout" in v for v in out.values())
    from simlib.tasks import RegressionTask

    try:
        Plan(dp=4).validate(4, RegressionTask(global_batch=6))
        impossible = "accepted"
    except ValueError as exc:
        impossible = str(exc)
    ok = ok and "[]" not in impossible
    return _result(
        ok_error=ok,
        detail=" | ".join(f"{k}: {v}" for k, v in out.items()) + f" | Plan(dp=4) on a global batch of 6: {impossible}",
    )


# ── 8. class grading ──
KILLER = """import os, re, signal
child = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")  # the grading child that runs this kernel
os.kill(int(child[child.index("--parent") + 1]), signal.SIGKILL)  # ...and the grader that started it"""
HIDER = """import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "MARK"], env={}, start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"""


def _notebook(path, extra):
    import nbformat

    book = nbformat.read(str(ROOT / "exercises" / "04_one_f_one_b.ipynb"), as_version=4)
    book.cells.append(nbformat.v4.new_code_cell(extra))
    nbformat.write(book, str(path))


def _with_cmdline(mark):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found += [int(pid)] if mark.encode() in f.read() else []
        except OSError:
            pass
    return found


@probe("class grading: a submission that kills `simlib grade`, then a rerun")
def _p_grade_killer(ctx):
    folder = Path(ctx.dir()) / "class"
    folder.mkdir(parents=True)
    _notebook(folder / "a_04_one_f_one_b.ipynb", KILLER)
    _notebook(folder / "b_04_one_f_one_b.ipynb", "pass")
    out = folder.parent / "grades" / "grades.csv"
    runs = [_simlib("grade", str(folder), "--out", str(out), "--timeout", "120", timeout=900) for _ in range(2)]
    rows = out.read_text().splitlines() if out.exists() else []
    a = [r for r in rows if "a_04" in r]
    b = [r for r in rows if "b_04" in r]
    ok = runs[0].returncode != 0 and runs[1].returncode == 0 and a and b and "stopped while" in " ".join(a)
    return _result(
        ok_error=ok,
        detail=f"first run rc {runs[0].returncode} (killed by a's cell); rerun rc "
        f"{runs[1].returncode}: a -> {a[:1]}; b graded: {bool(b)}",
    )


@probe("class grading: a process started with a cleared environment, in a session of its own")
def _p_grade_hider(ctx):
    import secrets

    mark = "simlib-hider-" + secrets.token_hex(4)
    folder = Path(ctx.dir()) / "class"
    folder.mkdir(parents=True)
    _notebook(folder / "h_04_one_f_one_b.ipynb", HIDER.replace("MARK", mark))
    done = _simlib("grade", str(folder), "--out", str(folder.parent / "grades.csv"), "--timeout", "120", timeout=900)
    left = _with_cmdline(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return _result(
        not left and done.returncode == 0,
        detail=f"grade rc {done.returncode}; processes left after its row: {left or 'none'}",
    )
