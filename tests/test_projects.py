"""Projects 2 and 3 as Tasks: deterministic data, world-size invariant batches, the seeding bug caught, bad args."""

import pytest
import torch

from simlib.projects import seeding
from simlib.projects.finance import HedgingTask, real_windows
from simlib.projects.vision import DigitsTask, load_digits_split


def test_digits_split_is_held_out_and_stratified():
    x_tr, y_tr, x_te, y_te = load_digits_split()
    assert len(x_tr) + len(x_te) == 1797 and len(x_te) == 450
    assert torch.bincount(y_te).min() >= 40  # every class in the held-out split
    train = {tuple(r.flatten().tolist()) for r in x_tr}
    assert sum(tuple(r.flatten().tolist()) in train for r in x_te) < 5  # (digits has a few exact duplicates)


@pytest.mark.parametrize(
    "make", [lambda: DigitsTask(global_batch=32, image_size=12), lambda: HedgingTask(global_batch=128, block=16)]
)
def test_batches_are_deterministic_and_world_size_invariant(make):
    task = make()
    x, y = task.batch(5)
    x2, y2 = make().batch(5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(task.batch(6)[0], x)
    for parts in (2, 4):
        xs, ys = zip(*(task.batch(5, p, parts) for p in range(parts)))
        assert torch.equal(torch.cat(xs), x) and torch.equal(torch.cat(ys), y)
        assert seeding.duplicate_parts(list(xs)) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: DigitsTask(global_batch=32, image_size=12, loader="same_seed"),
        lambda: HedgingTask(global_batch=128, block=16, paths_seeding="same_seed"),
    ],
)
def test_same_seed_on_every_rank_is_detected(make):
    task = make()
    parts = [task.batch(3, p, 4)[0] for p in range(4)]
    assert seeding.duplicate_parts(parts) == [(i, j) for i in range(4) for j in range(i + 1, 4)]


def test_per_rank_seeds_differ():
    task = DigitsTask(global_batch=32, image_size=12, loader="per_rank")
    assert seeding.duplicate_parts([task.batch(0, p, 2)[0] for p in range(2)]) == []


def test_check_distinct_on_two_ranks(cluster2):
    def harness(loader):
        import torch.distributed as dist

        from simlib.projects.seeding import DuplicateDataError, check_distinct
        from simlib.projects.vision import DigitsTask

        x, _ = DigitsTask(global_batch=16, image_size=8, loader=loader).batch(0, dist.get_rank(), 2)
        try:
            check_distinct(x)
        except DuplicateDataError as e:
            return str(e)
        return "ok"

    assert cluster2.run(harness, "global") == ["ok", "ok"]
    msgs = cluster2.run(harness, "same_seed")
    assert all("ranks 0 and 1" in m and "seed" in m for m in msgs)


def test_models_start_equal_and_evaluate():
    task = DigitsTask(global_batch=16, image_size=12, width=8)
    a, b = task.build_model(), task.build_model()
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    metrics = task.evaluate(a)
    assert set(metrics) == {"accuracy", "eval_loss"} and 0 <= metrics["accuracy"] <= 1
    assert len(task.blocks(a)) == 3
    fin = HedgingTask(global_batch=64, block=16)
    m = fin.evaluate(fin.build_model())
    assert {"rmse_sim", "bs_rmse_sim", "rmse_real", "bs_rmse_real", "eval_loss"} <= set(m)


def test_finance_calibrates_on_training_years_only():
    early, late = HedgingTask(train_end="2005-12-31"), HedgingTask()
    assert early.vol != late.vol and 0.05 < late.vol < 0.5
    windows = real_windows(30, late.test_start)
    assert torch.allclose(windows[:, 0], torch.ones(len(windows))) and windows.shape[1] == 31


@pytest.mark.parametrize(
    "bad",
    [dict(global_batch=0), dict(image_size=4), dict(loader="rank"), dict(holdout=1.5), dict(seed=-1), dict(width=2.5)],
)
def test_vision_bad_arguments(bad):
    with pytest.raises(ValueError):
        DigitsTask(**bad)


@pytest.mark.parametrize(
    "bad",
    [
        dict(global_batch=100, block=32),
        dict(cost=0.5),
        dict(paths_seeding="rank"),
        dict(days=0),
        dict(train_end="1999-01-10"),
    ],
)
def test_finance_bad_arguments(bad):
    with pytest.raises(ValueError):
        HedgingTask(**bad).vol


def test_bad_batch_requests():
    task = DigitsTask(global_batch=30)
    with pytest.raises(ValueError, match="equal parts"):
        task.batch(0, 0, 4)
    with pytest.raises(ValueError):
        task.batch(-1)
    with pytest.raises(ValueError):
        task.batch(0, 2, 2)
    with pytest.raises(ValueError, match="blocks"):
        HedgingTask(global_batch=96, block=32).batch(0, 0, 2)
