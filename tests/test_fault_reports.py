"""Eight faults that lost work or misled (issue 38), each reproduced and held: an unverifiable checkpoint, two runs
in one folder, the disk estimate, task sizes of 0, a rank killed during a save, NaN on one rank, layout changes,
and a submission that stops the grader or hides its processes from the clean-up.

Single-process checks first (seconds); one warm 2-rank call for NaN and layout changes; one cold 2-rank launch for
the killed rank (about 20 s); one graded notebook for the clean-up (about 20 s).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import torch
from worlds import limit  # a time limit for an idle machine, scaled to this one now

import simlib
from simlib import checkpoint, guards
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, decay_steps=8, grad_clip=1.0)


def _reg(**kw):
    from simlib.tasks import RegressionTask

    return RegressionTask(**{**dict(width=16, depth=2, global_batch=16, num_samples=128), **kw})


def _losses(plan, steps, task=None, optim=OPTIM, **kw):
    from simlib.train import train

    record = train(
        task or _reg(), plan, steps=steps, optim=optim, log_every=1, verbose=False, measure_memory=False, **kw
    )
    return {r["step"]: r["loss"] for r in record.rows}


# ── 1. a checkpoint that cannot be verified is passed over ──
def test_a_checkpoint_without_its_manifest_is_passed_over(tmp_path, one_process):
    plan = Plan(checkpoint_dir=str(tmp_path), checkpoint_every=2)
    full = _losses(Plan(), 8)
    _losses(plan, 6)
    newest = tmp_path / "step_00000006"
    (newest / "manifest.json").unlink()
    data = bytearray((newest / "__0_0.distcp").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 256] = os.urandom(256)
    (newest / "__0_0.distcp").write_bytes(bytes(data))
    assert "no manifest.json" in checkpoint.verify(newest)
    with pytest.warns(
        checkpoint.CheckpointFallbackWarning,
        match="step_00000006 cannot be used: it has no "
        "manifest.json.*cannot be verified.*Resumed from the previous one, step_00000004",
    ):
        resumed = _losses(plan, 8)
    assert resumed == {s: full[s] for s in (4, 5, 6, 7)}  # bit-equal from step 4, never the garbage


# ── 2. one run per checkpoint folder ──
HOLDER = (
    "import sys, time\nfrom simlib import checkpoint\nh = checkpoint.hold(sys.argv[1])\n"
    "print('held', flush=True)\ntime.sleep(120)\n"
)


def test_a_second_run_on_a_held_folder_is_refused_in_one_line(tmp_path, one_process):
    folder = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            checkpoint.CheckpointError,
            match=rf"checkpoint_dir {folder} is in use by another run "
            rf"\(pid {holder.pid} on .*\): .*give another checkpoint_dir",
        ) as info:
            _losses(Plan(checkpoint_dir=str(folder), checkpoint_every=2), 4)
        assert "\n" not in str(info.value)
        assert not checkpoint.list_checkpoints(folder)  # nothing trained, nothing saved
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "simlib",
                "train",
                "gpt",
                "--quick",
                "--world-size",
                "1",
                "--plan.checkpoint-dir",
                str(folder),
                "--plan.checkpoint-every",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        err = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(err) == 1 and "is in use by another run" in err[0], done.stderr
    finally:
        holder.kill()
        holder.wait()
    assert _losses(Plan(checkpoint_dir=str(folder), checkpoint_every=2), 2)  # released with its process
    again = checkpoint.hold(folder)  # the same process may hold it twice (two train() calls one after the other)
    assert again is not None
    again.close()


# ── 3. the disk estimate covers what a save writes ──
def test_the_disk_estimate_covers_what_a_save_writes(tmp_path, one_process):
    from simlib.projects.gpt.task import GPTTask
    from simlib.train import TrainState, build_optimizer

    for task in (GPTTask.quick(global_batch=8, eval_windows=4), _reg()):
        model = task.build_model()
        optimizer = torch.optim.AdamW(model.parameters())
        state = TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
        state.meta = guards.run_meta(task, Plan(), OptimConfig(), 8)
        x, y = task.batch(0)
        folder = tmp_path / task.name
        estimate = checkpoint.preflight(folder, state)  # before any step, as the trainer calls it
        task.loss(model(x), y).backward()
        optimizer.step()  # Adam's moments exist from the first step on
        written = checkpoint.save(folder, state, step=1).nbytes
        # at least what is written (the run must not fail at its first save), and not far above it
        assert written <= estimate <= 1.1 * written + 4096, (task.name, estimate, written)
    assert build_optimizer  # (imported: the trainer's own optimizer factory exists beside TrainState)


# ── 4. task fields of every project, before launch ──
@pytest.mark.parametrize(
    "make, words",
    [
        ("gpt", dict(seq_len=0)),
        ("gpt", dict(hidden=0)),
        ("gpt", dict(global_batch=0)),
        ("gpt", dict(eval_windows=0)),
        ("gpt", dict(num_layers=-1)),
        ("gpt", dict(num_heads=3)),
        ("gpt", dict(seq_len=10**7)),
        ("gpt", dict(moe_capacity_factor=0)),
        ("gpt", dict(moe_top_k=0)),
        ("gpt", dict(seed=-1)),
        ("vision", dict(augment="yes")),
        ("vision", dict(holdout="x")),
        ("finance", dict(train_end="soon")),
        ("finance", dict(cost="x")),
    ],
)
def test_a_wrong_task_field_is_refused_in_one_line(make, words):
    from simlib.projects.finance.task import HedgingTask
    from simlib.projects.gpt.task import GPTTask
    from simlib.projects.vision.task import DigitsTask

    cls = {"gpt": GPTTask.quick, "vision": DigitsTask, "finance": HedgingTask}[make]
    ((field, value),) = words.items()
    with pytest.raises(ValueError) as info:
        cls(**words)
    text = str(info.value)
    assert "\n" not in text and (field in text or "num_heads" in text), text


def test_eval_windows_0_is_refused_by_the_command_line_before_any_step(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "simlib", "train", "gpt", "--quick", "--world-size", "1", "--task.eval-windows", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    err = done.stderr.strip().splitlines()
    assert (
        done.returncode != 0
        and err == ["error: GPTTask.eval_windows must be an int >= 1, got 0"]
        or (len(err) == 1 and "eval_windows must be an int >= 1" in err[0])
    ), done.stderr + done.stdout[-500:]
    assert "step" not in done.stdout  # refused before training


# ── 5. a rank killed during a save ──
def test_a_save_that_lost_a_peer_says_so_and_what_is_on_disk(tmp_path):
    from simlib.checkpoint_files import _disk_error

    (tmp_path / "step_00000003.partial").mkdir()
    exc = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:23447: Connection reset by peer. GLHF")
    text = str(_disk_error(exc, tmp_path, 3))
    assert "another rank was lost during the save" in text and "step_00000003.partial is still on disk" in text
    assert "removed" not in text, text


def test_a_legitimate_difference_in_gather_object_is_no_mismatch():
    """Each rank sends its own object to gather_object (DCP: a list of its writes, 65 on one rank, 3 on another):
    recorded through the real wrapper, the two ranks' calls match; another collective does not."""
    from simlib.debug import hangs

    before, logs = hangs._log, {}
    try:
        for rank, n, op in ((0, 65, "gather_object"), (1, 3, "gather_object"), (2, 3, "all_gather_object")):
            hangs._log = hangs._Log(None, rank)
            hangs._wrap(op, lambda obj, object_gather_list=None, dst=0, group=None: None)(
                obj=list(range(n)), object_gather_list=None, dst=0
            )
            logs[rank] = hangs.history()
    finally:
        hangs._log = before
    assert hangs.first_divergence({0: logs[0], 1: logs[1]}, 2) is None
    assert hangs.first_divergence({0: logs[0], 1: logs[2]}, 2) is not None


def _die_in_save(base):
    from simlib.faults import KillAt
    from simlib.train import train

    train(
        KillAt(_reg(), step=2, rank=1, during_save=True),
        Plan(dp=2, checkpoint_dir=base, checkpoint_every=3),
        steps=5,
        verbose=False,
        measure_memory=False,
    )


def test_a_rank_killed_during_a_save_is_named_first(tmp_path):
    with pytest.raises(simlib.WorkerError) as info:
        simlib.launch(_die_in_save, 2, str(tmp_path), max_restarts=0, timeout=limit(10))
    lines = str(info.value).splitlines()
    assert "rank 1 died first" in lines[0], lines[0]
    assert lines[1].startswith("rank 1: WorkerDied"), lines[:3]
    said = "\n".join(lines)
    assert "look at what they did instead" not in said, said  # it died: no advice about a rank's condition
    if "rank 0: CheckpointError" in said:  # rank 0 saw the lost peer (not a full disk), and removed the folder
        assert "another rank was lost during the save" in said and "partial folder was removed" in said
        assert not list(tmp_path.glob("*.partial"))


# ── 6 and 7, on the warm 2-rank cluster ──
class NaNOnRank1:
    """The regression task, but the second half of global batch 2 (rank 1's part at dp=2) holds a NaN."""

    def __init__(self):
        self.task = _reg()

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step):
        x, y = self.task.batch(step)
        if step == 2:
            x = x.clone()
            x[-1, 0] = float("nan")
        return x, y


def _nan_and_layouts(base):
    out = {}
    try:
        _losses(Plan(dp=2), 4, task=NaNOnRank1())
    except guards.NonFiniteError as exc:
        out["nan"] = str(exc)
    _losses(Plan(dp=2, checkpoint_dir=base, checkpoint_every=2), 2)  # saved by plain DP, resumed under ZeRO-1
    for allow in ((), ("plan.zero_stage",)):
        try:
            _losses(Plan(dp=2, zero_stage=1, checkpoint_dir=base), 4, allow_changes=allow)
            out[f"zero{allow}"] = "resumed"
        except checkpoint.CheckpointMismatch as exc:
            out[f"zero{allow}"] = str(exc)
    return out


def test_nan_names_its_rank_and_layout_changes_are_not_offered_allow_changes(tmp_path, cluster2):
    out = cluster2.call(_nan_and_layouts, (str(tmp_path),), timeout=300)[0]
    nan = out["nan"]
    assert "step 2: the batch rank 1 trained on at step 2 holds NaN or inf: the data is at fault" in nan, nan
    assert "spread it to ranks [0, 1]" in nan and "Look at task.batch(2) on rank 1" in nan, nan
    assert "grad_clip (now" not in nan and "lower the lr" not in nan, nan  # no cure for a NaN in the data
    for allow in ((), ("plan.zero_stage",)):
        text = out[f"zero{allow}"]
        assert "plan.zero_stage: saved 0, now 1" in text and "Plan(zero_stage=0" in text, text
        assert "allow_changes" not in text and "\n" not in text, text


def test_a_whole_checkpoint_loaded_into_rank_parts_names_the_plan_change(tmp_path, one_process):
    """Without the run's meta (a state of one's own, lesson 08), the load itself tells the change of layout from a
    fresh optimizer."""
    from simlib.train import TrainState

    def state(shard=""):
        model = _reg().build_model()
        optimizer = torch.optim.AdamW(model.parameters())
        return TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), shard=shard)

    whole = state()
    x, y = _reg().batch(0)
    _reg().loss(whole.model(x), y).backward()
    whole.optimizer.step()
    checkpoint.save(tmp_path, whole, step=1)
    with pytest.raises(ValueError, match=r"whole \(unsharded\) model and optimizer.*\(dp0 here\): the plan changed"):
        checkpoint.load(tmp_path / "step_00000001", state("dp0"))


def test_impossible_global_batch_says_what_would_work():
    with pytest.raises(ValueError) as info:
        Plan(dp=4).validate(4, _reg(global_batch=6))
    assert "[]" not in str(info.value) and "multiple of 4" in str(info.value), str(info.value)


# ── 8. class grading: a submission that stops the grader; processes that hide from the clean-up ──
EXERCISE = "04_one_f_one_b.ipynb"


def test_a_submission_that_stopped_the_grader_is_a_failed_row_on_rerun(tmp_path):
    from simlib.grading import batch, journal

    folder = tmp_path / "class"
    folder.mkdir()
    killer = folder / f"mallory_{EXERCISE}"
    killer.write_text((ROOT / "exercises" / EXERCISE).read_text())
    log = tmp_path / "grades.rows.jsonl"
    journal.append(log, str(killer), journal.digest(killer), started=True)  # the grader died while it ran
    said = []
    t0 = time.monotonic()
    rows = batch.grade([folder], timeout=limit(60), journal=log, progress=said.append)
    assert [(r.status, r.passed) for r in rows] == [("error", False)], rows
    assert "stopped while it ran" in said[0] and time.monotonic() - t0 < 30  # not run again
    done, started = journal.read(log, batch.Row)
    assert (str(killer), journal.digest(killer)) in done and not started


HIDER = """import os, subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "simlib-hider-MARK"], env={},
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)"""


@pytest.mark.skipif(not Path("/sys/fs/cgroup").is_dir(), reason="no cgroup file system")
def test_a_process_with_a_cleared_environment_is_cleaned_up(tmp_path):
    import secrets

    from simlib.grading import batch, isolation

    make = getattr(isolation, "new_cgroup", lambda token: "(before the fix: no cgroups)")
    probe = make("probe-" + secrets.token_hex(4))
    if probe is None:
        pytest.skip("no cgroup can be made here (not root, or no writable hierarchy)")
    if isinstance(probe, Path):
        isolation.remove_cgroup(probe)
    mark = "simlib-hider-" + secrets.token_hex(4)
    folder = tmp_path / "class"
    folder.mkdir()
    nb = (ROOT / "exercises" / EXERCISE).read_text()
    import nbformat

    book = nbformat.reads(nb, as_version=4)
    book.cells.append(nbformat.v4.new_code_cell(HIDER.replace("simlib-hider-MARK", mark)))
    nbformat.write(book, str(folder / f"hider_{EXERCISE}"))
    batch.grade([folder], timeout=120, progress=lambda text: None)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    for pid in found:  # do not leave it behind if the test fails
        os.kill(pid, 9)
    assert found == [], "a process with no environment, in a session of its own, outlived its submission"
