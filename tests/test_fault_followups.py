"""The four faults the probes of issue 51 still found open, each held by a test that failed before its fix:

(a) ``simlib train``'s one line for a killed rank 0 leads with "rank 0 died first", not with rank 1's "Connection
    closed by peer" (its consequence);
(b) a batch *part* of the wrong size on one rank ends, on every rank, with the clear error the whole-batch case
    gets, within seconds (before: that rank alone raised; its peers waited in the gradient all-reduce until the
    launcher stopped them with a "hang" report, or, where the caller went on, until Gloo's receive timed out);
(c) the preflight refuses, before any step, a disk with room for one checkpoint but not for the ones rotation
    keeps (before: a warning, then the third save failed mid-run);
(d) a NaN that begins in one rank's data is blamed on that rank's batch, not answered with "a smaller grad_clip".

Single-process checks first (milliseconds); one warm 2-rank call for (b) and (d) (a few seconds).
"""

import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import cloudpickle
import pytest
import torch

from simlib import checkpoint, guards
from simlib.errors import RemoteFailure, WorkerError
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _reg(**kw):
    from simlib.tasks import RegressionTask

    return RegressionTask(**{**dict(width=16, depth=2, global_batch=16, num_samples=128), **kw})


def _train(task, plan, steps, **kw):
    from simlib.train import train

    return train(task, plan, steps=steps, log_every=1, verbose=False, measure_memory=False, **kw)


# ── (a) a killed rank 0, in the command line's one line ──
def test_the_command_line_leads_with_the_rank_that_died_not_its_peers_lost_connection():
    """The failures the launcher reports when rank 0 is SIGKILLed mid-run (seen from `simlib train gpt`): rank 0
    died, rank 1 raised Gloo's lost connection. The one line must lead with rank 0, as the error's own first line
    ("rank 0 died first; then 1") does."""
    from simlib.cli import _one_line

    failures = {
        0: RemoteFailure(0, "WorkerDied", "killed by SIGKILL (often the out-of-memory killer, ...)", ""),
        1: RemoteFailure(
            1,
            "DistBackendError",
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Connection closed by peer [127.0.0.1]:40523",
            "Traceback ...",
        ),
    }
    line = _one_line(WorkerError("2 of 2 rank(s) failed (rank 0 died first; then 1)", failures))
    assert line.startswith("rank 0 died first, killed by SIGKILL"), line
    assert "rank 1 then failed: DistBackendError: Connection closed by peer" in line, line
    # a rank's own error, with no rank dead, is still said whole: it says what to do
    alone = {1: RemoteFailure(1, "ValueError", "rank 1, step 0: task 'x' returned ... fix task.batch()", "")}
    assert _one_line(WorkerError("1 of 2 rank(s) failed (rank 1)", alone)).startswith("rank 1: ValueError: rank 1")


# ── (b) a batch part of the wrong size, on one rank only ──
class _Rows9:
    """The regression task, but rank 1's part of global batch 1 has 9 rows where 8 were declared."""

    def __init__(self):
        self.task = _reg()

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step, part=0, parts=1):
        x, y = self.task.batch(step, part=part, parts=parts)
        return (torch.cat([x, x[:1]]), torch.cat([y, y[:1]])) if part == 1 and step == 1 else (x, y)


def _wrong_parts():
    """Plain DP, and DP with 2 micro-batches (9 rows would not split): each ends in the same ValueError."""
    said = {}
    for name, plan in (("dp2", Plan(dp=2)), ("dp2 accumulation 2", Plan(dp=2, accumulation=2))):
        try:
            _train(_Rows9(), plan, 3)
            said[name] = None
        except ValueError as exc:
            said[name] = str(exc)
    return said


def test_a_wrong_batch_part_on_one_rank_stops_every_rank_with_the_clear_error(cluster2):
    # today's code: rank 1 raised alone, rank 0 waited in the gradient all-reduce and was stopped ("a hang")
    outs = cluster2.call(_wrong_parts, timeout=120)
    for rank, said in enumerate(outs):
        for name, text in said.items():
            assert text is not None, f"rank {rank}, {name}: trained on a 9-row part without a word"
            assert "rank 1, step 1: task 'mlp_regression' returned a batch part of 9 inputs rows where 8 were " in text
            assert "fix task.batch()" in text and "\n" not in text, text


# ── (c) room for the checkpoints that rotation keeps, checked at start ──
def test_disk_needed_counts_the_kept_checkpoints_and_the_one_being_written():
    mb = 1 << 20
    assert checkpoint.preflight.__module__ == "simlib.checkpoint_files"
    from simlib.checkpoint_files import disk_needed

    assert disk_needed(mb, [], keep=2) == 3 * mb  # two kept plus the one being written
    assert disk_needed(mb, [], keep=2, saves=1) == mb  # a run that saves once needs one
    assert disk_needed(mb, [mb, mb], keep=2) == mb  # a resumed run: two already on disk, one more at a time
    assert disk_needed(mb, [mb] * 4, keep=2) == mb  # older ones beyond keep are rotated out after the next save
    assert disk_needed(2 * mb, [mb], keep=2) == 5 * mb  # grown: 1 + 2, 2 + 1 + 2, 2 + 2 + 2 (6, 1 there now)
    assert disk_needed(0, [], keep=2) == 0


_Usage = namedtuple("_Usage", "total used free")


def test_preflight_refuses_a_disk_with_room_for_one_checkpoint_not_three(tmp_path, monkeypatch, one_process):
    """The free space is what shutil.disk_usage says (here: 2.5 checkpoints): the run needs 3 at its peak."""
    state = {"w": torch.zeros(64, 256), "step": 0}
    one = checkpoint.preflight(tmp_path / "roomy", state)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: _Usage(10 * one, 0, int(2.5 * one)))
    with pytest.raises(checkpoint.CheckpointError, match=r"room for 2 checkpoint\(s\) .* while 3 are on disk") as e:
        checkpoint.preflight(tmp_path / "small", state)
    assert "save 3 would fail mid-run" in str(e.value) and "\n" not in str(e.value)
    assert checkpoint.preflight(tmp_path / "small", state, saves=2) == one  # two saves fit: no refusal
    monkeypatch.setattr(shutil, "disk_usage", real)


def _tmpfs(path: Path, size: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): the check above covers it")
    return path


def test_a_real_small_disk_is_refused_before_any_step(tmp_path, one_process):
    """A tmpfs with room for about 2.5 checkpoints and a run that saves at every step: refused at start (before:
    a warning, two saves, and the third failed mid-run)."""
    roomy = tmp_path / "roomy"
    _train(_reg(), Plan(checkpoint_dir=str(roomy), checkpoint_every=1), 1)
    one = sum(f.stat().st_size for f in checkpoint.latest(roomy).rglob("*") if f.is_file())
    small = _tmpfs(tmp_path / "small", (int(one * 2.5) // 4096 + 1) * 4096)
    try:
        with pytest.raises(checkpoint.CheckpointError, match="while 3 are on disk during a save") as info:
            _train(_reg(), Plan(checkpoint_dir=str(small / "ckpt"), checkpoint_every=1), 4)
        assert "\n" not in str(info.value) and "larger disk" in str(info.value)
        assert not checkpoint.list_checkpoints(small / "ckpt")  # before any step: nothing was saved
    finally:
        subprocess.run(["umount", "--lazy", str(small)], capture_output=True)


# ── (d) a NaN that begins in one rank's data ──
class _NaNRowOnRank1:
    """The regression task, but rank 1's part of global batch 2 holds a NaN."""

    def __init__(self):
        self.task = _reg()

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, step, part=0, parts=1):
        x, y = self.task.batch(step, part=part, parts=parts)
        if part == 1 and step == 2:
            x = x.clone()
            x[-1, 0] = float("nan")
        return x, y


def _nan_in_data():
    try:
        _train(_NaNRowOnRank1(), Plan(dp=2), 4, optim=OptimConfig(lr=1e-2, grad_clip=1.0))
    except guards.NonFiniteError as exc:
        return str(exc)
    return None


def test_a_nan_in_one_ranks_data_blames_that_batch_not_the_lr(cluster2):
    text = cluster2.call(_nan_in_data, timeout=120)[0]
    assert text is not None, "trained on a NaN without a word"
    assert "the batch rank 1 trained on at step 2 holds NaN or inf: the data is at fault" in text, text
    assert "task.batch(2) on rank 1" in text, text
    assert "a smaller grad_clip (now" not in text and "lower the lr (now" not in text, text  # not the training's


def test_a_nan_loss_on_one_rank_only_points_at_its_batch():
    """One rank's loss NaN while another's was finite (the data looked finite: a value out of range, say): the
    batch is what differs between them, so it is named, not the lr or the clipping."""
    bad = guards.Nonfinite([(0, False, True, False), (1, True, True, False)])
    bad.finite_loss = (0,)
    text = guards.nonfinite_message(2, bad, lr=1e-2, grad_clip=1.0)
    assert "on rank 1 while rank 0 computed a finite loss" in text and "the data is the likely fault" in text
    assert "task.batch(2) on rank 1" in text and "grad_clip (now" not in text, text
    # every rank's loss NaN: the training diverged, and the lr and clipping are the remedies
    every = guards.Nonfinite([(0, True, True, False), (1, True, True, False)])
    text = guards.nonfinite_message(5, every, lr=1e6, grad_clip=1.0)
    assert "training diverged" in text and "a smaller grad_clip (now 1)" in text and "Lower the lr" in text, text
