"""Project 2's learner pieces (solutions/11_vision_pieces.ipynb): SyncBatchNorm's autograd Function and the data
shard. Each planted wrong piece is caught by its check with a hint that names the mistake; a run with pieces runs
the learner's code at both slots on every rank; a wrong piece changes the run or stops it with a clear error; the
course's own pieces passed as pieces give the very run without pieces."""

import sys

import cloudpickle
import pytest
import torch
from planted import vision_pieces as planted

from simlib import grading

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HINTS = {
    "LocalStatistics": "own samples' statistics",
    "AveragedStatistics": "averaged the ranks' means",
    "Float32Sums": "float64",
    "ReducedParameterGradients": "did you all-reduce them",
    "LocalBackward": "through the shared statistics",
    "strided": "another arrangement",
    "one_epoch_per_batch": "epoch's end",
    "own_permutation": "order(epoch)",
    "floor_division": "valueerror",
}
BUGS = [("sync_batchnorm", k, v) for k, v in planted.SYNC_BATCHNORM.items()] + [
    ("data_shard", k, v) for k, v in planted.DATA_SHARD.items()
]


@pytest.mark.parametrize("exercise,name,bug", BUGS, ids=[b[1] for b in BUGS])
def test_planted_piece_is_caught_with_its_hint(exercise, name, bug, clusters):
    report = grading.check(exercise, bug, clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed and report.status in ("fail", "error"), "\n".join(r.line() for r in report.results)
    hints = " ".join(r.hint for r in report.failed()).lower()
    assert HINTS[name].lower() in hints, "\n".join(r.line() for r in report.results)


def _losses(cluster, pieces, out_dir, steps=3):
    from simlib.projects.runner import run_project

    record, _ = run_project(
        "vision",
        2,
        quick=True,
        verbose=False,
        steps=steps,
        eval_every=steps,
        pieces=pieces,
        cluster=cluster,
        target=None,
        out_dir=out_dir,
    )
    return [r["loss"] for r in record.rows], record.summary["pieces"]


def _counting(slot, fn):
    """``fn`` at ``slot``, noting every call's rank in a file of its own (the workers' calls, seen from here)."""
    import tempfile

    where = tempfile.mkdtemp(prefix="visp_pieces_")

    def note():
        import os

        import torch.distributed as dist

        with open(os.path.join(where, f"{slot}.{dist.get_rank()}"), "a") as f:
            f.write("x")

    if isinstance(fn, type):  # an autograd Function: count its forward

        class Counted(fn):
            @staticmethod
            def forward(ctx, *args):
                note()
                return fn.forward(ctx, *args)

        return Counted, where

    def counted(*args):
        note()
        return fn(*args)

    return counted, where


def test_a_run_runs_the_learners_pieces_on_every_rank_and_the_given_ones_change_nothing(cluster2, tmp_path):
    import os

    from simlib.projects.registry import get

    slots = get("vision").pieces
    given = {k: s.load_given() for k, s in slots.items()}
    bn, bn_dir = _counting("sync_batchnorm", given["sync_batchnorm"])
    shard, shard_dir = _counting("data_shard", given["data_shard"])
    plain, used_none = _losses(cluster2, {}, tmp_path / "plain")
    counted, used = _losses(cluster2, {"sync_batchnorm": bn, "data_shard": shard}, tmp_path / "given")
    assert used_none == [] and used == ["data_shard", "sync_batchnorm"]
    assert counted == plain  # the course's own pieces through the slots: the very same run
    for d, slot in ((bn_dir, "sync_batchnorm"), (shard_dir, "data_shard")):
        assert sorted(os.listdir(d)) == [f"{slot}.0", f"{slot}.1"], os.listdir(d)  # called on both ranks
    # a wrong piece in the loop: per-rank statistics train another model; a shard of floats stops the run clearly
    wrong, _ = _losses(cluster2, {"sync_batchnorm": planted.LocalStatistics}, tmp_path / "wrong")
    assert max(abs(a - b) for a, b in zip(wrong, plain)) > 1e-4

    def floats(step, rank, world_size, global_batch, num_samples, order):
        return torch.zeros(global_batch // world_size)

    with pytest.raises(Exception, match="your data_shard piece returned"):
        _losses(cluster2, {"data_shard": floats}, tmp_path / "floats", steps=1)
