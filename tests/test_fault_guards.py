"""Nothing lost on any fault (issue 21): sharded checkpoints that resume, timeouts on every group, no training on
NaN or garbage, disk trouble in one line, a run's identity checked at resume, every argument validated.

The multi-process checks share launches: one 2-rank launch saves every 2-rank plan, is killed (SIGKILL on rank 1),
restarts (max_restarts=1) and resumes them all; one 4-rank call stops and resumes the compositions.
"""

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace

import cloudpickle
import pytest
import torch
from worlds import limit  # a time limit for an idle machine, scaled to this one now

import simlib
from simlib import checkpoint, guards
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EVERY, STOP, STEPS = 3, 5, 8  # save every 3 steps; the first attempt stops (or dies) at step 5; 8 steps in all
PLANS2 = {
    "dp2": Plan(dp=2),
    "tp2": Plan(tp=2),
    "pp2": Plan(pp=2, accumulation=2),
    "zero1": Plan(dp=2, zero_stage=1),
    "zero2": Plan(dp=2, zero_stage=2),
    "zero3": Plan(dp=2, zero_stage=3),
}
PLANS4 = {
    "dp2_tp2": Plan(dp=2, tp=2),
    "dp2_pp2": Plan(dp=2, pp=2, accumulation=2),
    "tp2_pp2": Plan(tp=2, pp=2, pp_microbatches=2),
    "dp2_pp2_zero1": Plan(dp=2, pp=2, pp_microbatches=2, zero_stage=1),
    "dp2_pp2_zero2": Plan(dp=2, pp=2, pp_microbatches=2, zero_stage=2),
    "dp2_tp2_zero2": Plan(dp=2, tp=2, zero_stage=2),
}
OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, decay_steps=STEPS, grad_clip=1.0, weight_decay=0.1)


def _gpt():
    from simlib.projects.gpt.task import GPTTask

    return GPTTask.quick(global_batch=8, eval_windows=4)


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


def _save_kill_resume(base, plans):
    """Attempt 0: every plan trains to STOP with checkpoints (the last one: rank 1 is killed at STOP).
    Attempt 1 (restarted workers): every plan resumes from its step-3 checkpoint; and a clean reference run."""
    from simlib.faults import KillAt

    ctx = simlib.init()
    names = list(plans)
    if ctx.restart_count == 0:
        for name in names:
            plan = replace(plans[name], checkpoint_dir=os.path.join(base, name), checkpoint_every=EVERY)
            if name == names[-1]:
                _losses(plan, STEPS, task=KillAt(_gpt(), step=STOP, rank=1))  # rank 1 dies here
            _losses(plan, STOP)
    out = {}
    for name in names:
        plan = replace(plans[name], checkpoint_dir=os.path.join(base, name), checkpoint_every=EVERY)
        out[name] = (_losses(plan, STEPS), _losses(plans[name], STEPS), ctx.restart_count)
    return out


def _check_resumed(out, plans):
    for name in plans:
        resumed, reference, attempt = out[name]
        assert min(resumed) == EVERY, f"{name} resumed at step {min(resumed)}, not from its step-{EVERY} checkpoint"
        assert resumed == {s: reference[s] for s in range(EVERY, STEPS)}, f"{name}: resumed run is not bit-equal"


def test_every_2_rank_plan_saves_is_killed_restarts_and_resumes_bit_equal(tmp_path):
    out = simlib.launch(_save_kill_resume, 2, str(tmp_path), PLANS2, max_restarts=1, timeout=limit(30))
    assert all(o[2] == 1 for o in out[0].values()), "the restarted attempt should have resumed every plan"
    _check_resumed(out[0], PLANS2)
    assert out[0] == out[1]  # every rank logs the global loss


def _stop_and_resume(base, plans):
    out = {}
    for name, plan in plans.items():
        saved = replace(plan, checkpoint_dir=os.path.join(base, name), checkpoint_every=EVERY)
        _losses(saved, STOP)
        out[name] = (_losses(saved, STEPS), _losses(plan, STEPS), 0)
    return out


def test_4_rank_compositions_resume_bit_equal(tmp_path, cluster4):
    out = cluster4.call(_stop_and_resume, (str(tmp_path), PLANS4), timeout=600)
    _check_resumed(out[0], PLANS4)


def _changed_plan(base):
    plan = Plan(tp=2, checkpoint_dir=base, checkpoint_every=EVERY)
    _losses(plan, STOP)
    try:
        _losses(Plan(dp=2, checkpoint_dir=base), STEPS)
    except checkpoint.CheckpointMismatch as exc:
        return str(exc)
    return "not refused"


def _sigstop_rank1(stamp):
    import torch.distributed as dist

    ctx = simlib.init()
    _losses(Plan(tp=2), 1)  # warm: imports and first step done on both ranks
    dist.barrier()
    if ctx.rank == 1:
        import signal

        with open(stamp, "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return _losses(Plan(tp=2), 4)


def test_plan_change_refused_and_stopped_rank_named(tmp_path, cluster2):
    text = cluster2.call(_changed_plan, (str(tmp_path),), timeout=120)[0]
    # not resharded: the saved layout is named, and no allow_changes is offered (it could not load it)
    assert "plan.tp: saved 2, now 1" in text and "Plan(tp=2" in text and "allow_changes" not in text, text
    # a stopped rank (SIGSTOP) ends the run within the collective timeout, named
    cluster = simlib.Cluster(2, timeout=4, grace=2)
    stamp = tmp_path / "stopped_at"
    try:
        with pytest.raises(simlib.WorkerError) as info:
            cluster.call(_sigstop_rank1, (str(stamp),), timeout=300)
        elapsed = time.time() - float(stamp.read_text())
    finally:
        cluster.close()
    text = str(info.value).splitlines()[0]
    assert "rank 1 was stopped (SIGSTOP" in text, text
    assert elapsed < 4 + 2 + 20, f"took {elapsed:.0f} s"  # timeout + grace + slack for a loaded machine


def _unfreeze(world):
    """A layer unfrozen after 3 steps: ShardedOptimizer.add_param_group against plain AdamW."""
    import torch.distributed as dist

    from simlib.parallel.zero import ShardedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    ref = [p.detach().clone() for p in model.parameters()]
    ref_model = torch.nn.Sequential(*[torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)])
    with torch.no_grad():
        for p, q in zip(ref_model.parameters(), ref):
            p.copy_(q)
    opts = (
        ShardedOptimizer(list(model[1:].parameters()), torch.optim.AdamW, lr=1e-2),
        torch.optim.AdamW(list(ref_model[1:].parameters()), lr=1e-2),
    )
    for step in range(6):
        if step == 3:
            opts[0].add_param_group({"params": list(model[0].parameters())})
            opts[1].add_param_group({"params": list(ref_model[0].parameters())})
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        for m, o in zip((model, ref_model), opts):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            if m is model:
                for p in m.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad /= dist.get_world_size()
            o.step()
    return max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref_model.parameters()))


def _two_threads_value():
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t)


def test_add_param_group_keeps_state_and_two_threads_share_a_cluster(cluster2):
    gap = cluster2.call(_unfreeze, (2,), timeout=120)
    assert max(gap) < 1e-6, f"after add_param_group the sharded AdamW left plain AdamW by {max(gap):.3g}"
    results, errors = [], []

    def caller():
        try:
            for _ in range(3):
                results.append(cluster2.run(_two_threads_value))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == [[3.0, 3.0]] * 6


# ── single process: NaN, corrupted checkpoints, run identity, disk trouble, arguments ──
def _reg(**kw):
    from simlib.tasks import RegressionTask

    return RegressionTask(**{**dict(width=16, depth=2, global_batch=16, num_samples=128), **kw})


def test_nan_stops_naming_the_step_or_is_skipped_and_counted(one_process):
    with pytest.raises(guards.NonFiniteError, match=r"step \d+: the loss( and the gradients)? became NaN or inf"):
        _losses(Plan(), 10, task=_reg(), optim=OptimConfig(lr=1e6))
    from simlib.train import train

    record = train(
        _reg(), Plan(), steps=10, optim=OptimConfig(lr=1e6), nonfinite="skip", verbose=False, measure_memory=False
    )
    assert record.summary["skipped_steps"] > 0
    assert all(torch.isfinite(p).all() for p in record.model.module.parameters())  # no update from a bad step


def test_corrupted_newest_falls_back_and_rotation_keeps_the_good_one(tmp_path, one_process):
    plan = Plan(checkpoint_dir=str(tmp_path), checkpoint_every=2)
    full = _losses(Plan(), 8, task=_reg(), optim=replace(OPTIM, decay_steps=8))
    _losses(plan, 6, task=_reg(), optim=replace(OPTIM, decay_steps=8))
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [4, 6]
    newest = tmp_path / "step_00000006" / "__0_0.distcp"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)
    newest.write_bytes(bytes(data))
    checkpoint._rotate(tmp_path, keep=1)  # a corrupted newest never pushes out the last good one
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [4, 6]
    with pytest.warns(
        checkpoint.CheckpointFallbackWarning,
        match="step_00000006 cannot be used.*corrupted.*Resumed from the previous one, step_00000004",
    ):
        resumed = _losses(plan, 8, task=_reg(), optim=replace(OPTIM, decay_steps=8))
    assert resumed == {s: full[s] for s in (4, 5, 6, 7)}
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [6, 8]  # step 6 saved again, whole
    # truncated: both broken -> a clear error, never a silent fresh start
    for _, p in checkpoint.list_checkpoints(tmp_path):
        f = p / "__0_0.distcp"
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in .* can be read"):
        _losses(plan, 10, task=_reg(), optim=replace(OPTIM, decay_steps=8))


def test_a_changed_run_is_refused_naming_the_field_or_allowed(tmp_path, one_process):
    plan = Plan(checkpoint_dir=str(tmp_path), checkpoint_every=2)
    _losses(plan, 4, task=_reg(seed=0), optim=replace(OPTIM, decay_steps=8))
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"task.seed: saved 0, now 1"):
        _losses(plan, 8, task=_reg(seed=1), optim=replace(OPTIM, decay_steps=8))
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"task.global_batch: saved 16, now 32"):
        _losses(plan, 8, task=_reg(global_batch=32), optim=replace(OPTIM, decay_steps=8))
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"optim.lr: saved 0.01, now 0.001"):
        _losses(plan, 8, task=_reg(), optim=replace(OPTIM, decay_steps=8, lr=1e-3))
    from simlib.train import train

    record = train(
        _reg(),
        plan,
        steps=6,
        optim=replace(OPTIM, decay_steps=8, lr=1e-3),
        log_every=1,
        verbose=False,
        measure_memory=False,
        allow_changes=("optim.lr",),
    )
    assert record.rows[0]["step"] == 4
    assert record.rows[0]["lr"] < 1e-3 + 1e-12, record.rows[0]["lr"]  # the new lr is in force, not the saved one


def _tmpfs(path, size, ro=False):
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if ro else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")
    return path


def test_full_and_read_only_disks_in_one_line(tmp_path, one_process):
    full = _tmpfs(tmp_path / "small", "64k")
    ro = _tmpfs(tmp_path / "ro", "64k", ro=True)
    try:
        big = {"w": torch.zeros(64, 1024), "step": 1}  # 256 KB
        with pytest.raises(
            checkpoint.CheckpointError,
            match=r"the disk holding .* is full .* free.*the partial "
            "folder was removed",
        ):
            checkpoint.save(full, big)
        assert not list(full.iterdir())  # no partial left behind
        with pytest.raises(checkpoint.CheckpointError, match="has .* free, one checkpoint needs about"):
            checkpoint.preflight(full, big)
        with pytest.raises(checkpoint.CheckpointError, match="read-only file system"):
            checkpoint.preflight(ro / "ckpt")
        with pytest.raises(checkpoint.CheckpointError, match="read-only file system"):  # before any step runs
            _losses(Plan(checkpoint_dir=str(ro / "ckpt"), checkpoint_every=2), 4, task=_reg())
    finally:
        for p in (full, ro):
            subprocess.run(["umount", "--lazy", str(p)], capture_output=True)


class _Rows17:
    """A task whose batch has one row more than it declares."""

    def __init__(self):
        self.inner = _reg()
        self.name, self.global_batch = "rows17", 16

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batch(self, step):
        x, y = self.inner.batch(step)
        return torch.cat([x, x[:1]]), torch.cat([y, y[:1]])


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: OptimConfig(grad_clip=-1), "grad_clip must be None"),
        (lambda: OptimConfig(min_lr_ratio=-1), "min_lr_ratio must be in"),
        (lambda: OptimConfig(warmup_steps=-5), "warmup_steps must be an int >= 0"),
        (lambda: OptimConfig(betas=(2, 2)), "betas must be two numbers in"),
        (lambda: OptimConfig(lr=float("nan")), "lr must be a finite number"),
        (lambda: Plan(checkpoint_dir="x", checkpoint_every=-3), "checkpoint_every must be an int >= 0"),
        (lambda: guards.check_run_args(steps=-5), "steps must be an int >= 1"),
        (lambda: guards.check_run_args(steps=5, eval_every=-1), "eval_every must be an int >= 0"),
        (lambda: guards.check_run_args(steps=5, nonfinite="ignore"), "nonfinite='ignore' is unknown"),
        (
            lambda: __import__("simlib.projects.gpt.run", fromlist=["run"]).plan_for("single", 5),
            "plan 'single' runs on 1 process",
        ),
    ],
)
def test_bad_arguments_refused_in_one_line(make, words):
    with pytest.raises(ValueError, match=words) as info:
        make()
    assert "\n" not in str(info.value)


def test_wrong_batch_size_refused(one_process):
    with pytest.raises(ValueError, match=r"returned a global batch of 17 inputs rows where 16 were declared"):
        _losses(Plan(), 2, task=_Rows17())


def test_cli_errors_are_one_line_and_start_no_worker():
    env = {**os.environ, "SIMLIB_QUICK": "1"}
    # (benchmarks/faults.py also runs `train finance --world-size 3`: its standard run's set-up costs seconds)
    for argv, words in (
        (["train", "gpt", "--world-size", "5", "--plan", "single"], "plan 'single' runs on 1"),
        (["train", "gpt", "--plan", "tp", "--world-size", "3"], "does not divide"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "simlib", *argv], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_stale_temp_dirs_of_dead_callers_are_removed():
    from simlib.agent import _remove_stale_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tempfile.mkdtemp(prefix=f"simlib-{dead.pid}-")
    open(os.path.join(stale, "spec.json"), "w").write("{}")
    mine = tempfile.mkdtemp(prefix=f"simlib-{os.getpid()}-")
    try:
        _remove_stale_dirs()
        assert not os.path.exists(stale) and os.path.exists(mine)
    finally:
        os.rmdir(mine)
