"""Fault tolerance: checkpoints (simlib.checkpoint, torch.distributed.checkpoint) and restarts (max_restarts).

Exactness: at the same world size a resumed run repeats the uninterrupted run bit for bit (CPU, fp32): the same
operations run in the same order on the same values, since model, optimizer, schedule, RNG (dropout) and data
position all come back. At another world size (resharding) the DP average is summed in another order, so the
losses agree to rtol 2e-4 / atol 2e-5, the tolerance test_train.py gives DP against one process.
"""

import os
import shutil
import sys

import cloudpickle
import pytest
import torch
from worlds import limit  # a time limit for an idle machine, scaled to this one now

import simlib
from simlib import checkpoint
from simlib.faults import KillAt, read_run
from simlib.tasks import RegressionTask
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS, EVERY = 12, 4
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, decay_steps=STEPS, grad_clip=1.0)
TOL = dict(rtol=2e-4, atol=2e-5)


def _task(dropout=0.2):
    return RegressionTask(width=32, depth=2, global_batch=32, num_samples=512, dropout=dropout)


def run(plan=Plan(), steps=STEPS, task=None, out_dir=None, pid_dir=None):
    """Train; the losses by step (every rank returns them)."""
    from simlib.train import train

    if pid_dir is not None:
        open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    record = train(
        task or _task(),
        plan,
        steps=steps,
        optim=OPTIM,
        log_every=1,
        out_dir=out_dir,
        verbose=False,
        measure_memory=False,
    )
    return {r["step"]: r["loss"] for r in record.rows}


@pytest.fixture
def one_process():
    """train() in this process makes a one-rank process group: take it down after, and its environment."""
    saved = dict(os.environ)
    yield
    simlib.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def test_resume_is_bit_equal_and_each_missing_part_shows(tmp_path, one_process):
    full = run()
    run(Plan(checkpoint_dir=str(tmp_path / "a"), checkpoint_every=EVERY), steps=6)  # stops after step 6
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path / "a")] == [4]
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    resumed = run(Plan(checkpoint_dir=str(tmp_path / "a"), checkpoint_every=EVERY))
    assert min(resumed) == 4 and resumed == {s: full[s] for s in range(4, STEPS)}  # bit-equal
    # the classic bugs: leave one part out of the load, and the curve leaves the uninterrupted one
    for part in ("optimizer", "rng", "data"):
        with checkpoint.leaving_out(part):  # as if the checkpoint had not held it
            out = run(Plan(checkpoint_dir=str(tmp_path / "b")), steps=8)
        assert min(out) == 4
        gap = max(abs(out[s] - full[s]) for s in range(4, 8))
        assert gap > 1e-4, f"leaving out {part} should change the curve, max gap {gap:.2e}"


def test_crash_during_save_leaves_previous_checkpoint(tmp_path, one_process):
    w = torch.nn.Linear(3, 1)
    state = {"w": w.weight.detach().clone(), "step": 2}
    checkpoint.save(tmp_path, state)

    def crash():
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        checkpoint.save(tmp_path, {"w": torch.zeros(1, 3), "step": 4}, _before_commit=crash)
    assert (tmp_path / "step_00000004.partial" / ".metadata").exists()  # every byte written, never committed
    assert checkpoint.latest(tmp_path).name == "step_00000002"
    target = {"w": torch.zeros(1, 3), "step": 0}
    assert checkpoint.load_latest(tmp_path, target).step == 2
    assert torch.equal(target["w"], w.weight.detach()) and target["step"] == 2
    checkpoint.save(tmp_path, {"w": torch.ones(1, 3), "step": 6})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000006"]  # keep=2, no .partial


def test_fresh_optimizer_is_filled_and_missing_entries_refused(tmp_path, one_process):
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    checkpoint.save(tmp_path, {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 1})
    with pytest.raises(ValueError, match="does not ask for"):  # a bare dict: nothing creates Adam's state
        checkpoint.load_latest(
            tmp_path, {"model": m.state_dict(), "optimizer": torch.optim.AdamW(m.parameters()).state_dict(), "step": 0}
        )


def test_kill_during_save_restart_resumes_bit_equal(tmp_path, cluster2, alive):
    reference = cluster2.call(run, (Plan(dp=2),), timeout=120)[0]
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = Plan(dp=2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=EVERY)
    task = KillAt(_task(), step=5, rank=1, during_save=True)  # rank 1 dies inside the save at step 8
    out = simlib.launch(
        run, 2, plan, task=task, out_dir=str(tmp_path / "run"), pid_dir=str(pids), max_restarts=1, timeout=limit(20)
    )
    first, second = read_run(tmp_path / "run")
    assert [r["step"] for r in first] == list(range(8)) and second[0]["step"] == 4  # step 8 was never committed
    assert out[0] == {s: reference[s] for s in range(4, STEPS)} == out[1]  # bit-equal
    assert {r["step"]: r["loss"] for r in first} == {s: reference[s] for s in range(8)}
    assert len(os.listdir(pids)) == 4 and not any(alive(int(p)) for p in os.listdir(pids))


def _train_and_stop(plan, steps):
    return run(plan, steps=steps, task=_task(dropout=0.0))


def test_resharding_2_to_1_and_4(tmp_path, cluster2, cluster4, one_process):
    saved = str(tmp_path / "w2")
    reference = cluster2.call(_train_and_stop, (Plan(dp=2), STEPS), timeout=120)[0]
    cluster2.call(_train_and_stop, (Plan(dp=2, checkpoint_dir=saved, checkpoint_every=EVERY), 8), timeout=120)
    for world, where in ((1, None), (4, cluster4)):
        copy = str(tmp_path / f"w{world}")
        shutil.copytree(saved, copy)
        plan = Plan(dp=world, checkpoint_dir=copy)
        out = (
            run(plan, task=_task(0.0)) if where is None else where.call(_train_and_stop, (plan, STEPS), timeout=120)[0]
        )
        assert sorted(out) == list(range(8, STEPS)), f"world {world} did not resume at step 8"
        torch.testing.assert_close(
            [out[s] for s in out], [reference[s] for s in out], **TOL, msg=f"saved at world 2, loaded at world {world}"
        )


def _hang_then_die(pid_dir):
    import torch.distributed as dist

    ctx = simlib.init()
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if ctx.restart_count == 0 and ctx.rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: times out
    if ctx.restart_count == 1 and ctx.rank == 1:
        from simlib.faults import die

        die()
    dist.barrier()


def _attempt():
    return simlib.init().restart_count


def test_restarts_exhausted_list_every_cause_and_leave_no_orphan(tmp_path, alive, capsys):
    cluster = simlib.Cluster(2, max_restarts=1, timeout=3)
    with pytest.raises(simlib.WorkerError) as info:
        cluster.run(_hang_then_die, str(tmp_path))
    assert cluster.run(_attempt) == [0, 0]  # the next call starts fresh workers, with a fresh restart budget
    fresh = cluster.pids
    cluster.close()
    text = str(info.value)
    assert "failed on all 2 attempts (max_restarts=1 spent)" in text
    assert "attempt 1: rank 0 failed" in text and "attempt 2: rank 1 died" in text
    assert len(info.value.attempts) == 2
    captured = capsys.readouterr()
    assert "Restarting all 2 workers: restart 1 of max_restarts=1" in captured.err
    # starting fresh workers after the failure is information, not an error: stdout, not red
    assert "simlib: started 2 fresh workers" in captured.out and "fresh workers" not in captured.err
    assert len(os.listdir(tmp_path)) == 4 and not any(alive(int(p)) for p in os.listdir(tmp_path))
    assert len(fresh) == 2 and not any(alive(p) for p in fresh)


def test_bad_max_restarts():
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        simlib.Cluster(1, max_restarts=-1)


def test_an_exhausted_restart_names_the_rank_that_died_before_the_one_the_agent_stopped():
    # under load the agent's SIGTERM to rank 0 can land before rank 0's own error: rank 1's death is the cause
    from simlib.errors import RemoteFailure, _exhausted, describe_exit

    first = simlib.WorkerError("x", {0: RemoteFailure(0, "RuntimeError", "Timed out waiting 3000ms", "")})
    second = simlib.WorkerError(
        "y",
        {
            0: RemoteFailure(0, "WorkerDied", describe_exit(-15), ""),
            1: RemoteFailure(1, "WorkerDied", describe_exit(-9), ""),
        },
    )
    text = str(_exhausted([first, second], 1))
    assert "attempt 2: rank 1 died first, killed by SIGKILL" in text and "rank 0 then stopped (SIGTERM)" in text


def _rank_one_dies_on_the_first_attempt():
    import torch.distributed as dist

    from simlib import faults

    if faults._attempt() == 0 and dist.get_rank() == 1:
        faults.die()
    return faults._attempt()


def test_workers_the_agent_restarted_before_the_caller_stopped_the_old_ones_live(monkeypatch):
    """The race seen in CI: the agent noticed a dead rank and started the next attempt's workers (a forked start
    takes milliseconds) before the caller stopped the failed attempt's; the caller's stop then killed the new ones
    too and the call ran again on dead workers. Forced here: the caller waits for the agent's restart first."""
    import importlib
    import time

    from simlib import agent as agent_mod

    launch = importlib.import_module("simlib.launch")
    seen = {}
    await_workers, kill, restart = (
        agent_mod.ElasticWorkers._await_workers,
        agent_mod.ElasticWorkers._kill_workers,
        launch.Cluster._restart_workers,
    )

    def noting_the_agents_workers(self):
        await_workers(self)
        seen["workers"] = agent_mod._agents.get(self._run_id)._pcontext

    def after_the_agents_restart(self, *args, **kwargs):
        if seen.get("restarting"):
            agent, deadline = agent_mod._agents.get(self._run_id), time.monotonic() + 20
            while agent._pcontext is seen["workers"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert agent._pcontext is not seen["workers"], "the agent did not restart the workers"
        return kill(self, *args, **kwargs)

    def restarting(self, err):
        seen["restarting"] = True
        try:
            return restart(self, err)
        finally:
            seen["restarting"] = False

    monkeypatch.setattr(agent_mod.ElasticWorkers, "_await_workers", noting_the_agents_workers)
    monkeypatch.setattr(agent_mod.ElasticWorkers, "_kill_workers", after_the_agents_restart)
    monkeypatch.setattr(launch.Cluster, "_restart_workers", restarting)
    with simlib.Cluster(2, max_restarts=1, timeout=limit(20)) as cluster:
        assert cluster.call(_rank_one_dies_on_the_first_attempt, timeout=limit(60)) == [1, 1]
