"""Milestones of the hands-on projects: the check recomputes the held-out metric itself.

The answer is what the project's run returns, ``(task, record, state)``: the Task trained, the run record,
and rank 0's trained weights (``simlib.projects.runner.train_on`` / ``run_project``). The check never asks
the learner's code for the metric: it loads the held-out data with its own code, rebuilds the model from the
weights and measures, and it checks the run (processes, time budget) and that the held-out data stayed held
out (the split; the calibration period).
"""
from __future__ import annotations

import math

from . import Result, exercise

VISION_BUDGET_S = 60.0     # seconds of training (the record's train_time): evaluation not counted
FINANCE_BUDGET_S = 60.0


def _unpack(answer):
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise TypeError("the answer is the tuple (task, record, state) from run_project / train_on, "
                        f"got {type(answer).__name__}")
    task, record, state = answer
    summary = getattr(record, "summary", record)
    if not isinstance(summary, dict) or not isinstance(state, dict):
        raise TypeError("expected (task, RunRecord, state_dict): pass the record and the weights train_on returned")
    return task, summary, state


def _run_checks(summary, budget, world_size=2):
    ws = summary.get("world_size")
    yield Result(f"trained data-parallel on {world_size} processes", ws == world_size, detail=f"world size {ws}",
                 hint=f"run it with train_on({world_size}, task, Plan(dp={world_size}, ...)) or "
                      f"run_project(..., world_size={world_size}): the milestone is about data parallelism")
    t = summary.get("train_time") or float("inf")
    yield Result(f"within the time budget ({budget:g} s of training)", t <= budget, detail=f"{t:.1f} s",
                 hint="fewer steps, a larger learning rate with warm-up, or a smaller image size")


def vision_heldout(image_size: int, holdout: float = 0.25):
    """The check's own held-out digits: sklearn's split (stratified, seed 0), bilinear upscale, no augmentation."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    _, x_te, _, y_te = train_test_split(d.images.astype(np.float32) / 16.0, d.target, test_size=holdout,
                                        random_state=0, stratify=d.target)
    x = F.interpolate(torch.from_numpy(x_te).unsqueeze(1), size=(image_size, image_size), mode="bilinear",
                      align_corners=False)
    return (x - 0.3) / 0.4, torch.from_numpy(y_te).long()


def _accuracy(model, x, y, train_mode=False):
    import torch
    model.train(train_mode)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


@exercise("vision_milestone")
def _vision_milestone(answer, grader):
    from ..env import quick
    from ..projects.runner import load_state
    from ..projects.vision import baseline_logistic

    task, summary, state = _unpack(answer)
    yield from _run_checks(summary, VISION_BUDGET_S)
    held_out = getattr(task, "holdout", None) == 0.25 and getattr(task, "loader", None) == "global"
    yield Result("the held-out digits stayed held out", held_out,
                 detail=f"holdout {getattr(task, 'holdout', None)}, loader {getattr(task, 'loader', None)!r}",
                 hint="keep DigitsTask(holdout=0.25) and the default loader: the check measures on that split, "
                      "so a smaller holdout trains on images it tests on")
    model = load_state(task, state)
    x, y = vision_heldout(task.image_size)
    acc = _accuracy(model, x, y)
    target = 0.90 if quick() else max(0.97, baseline_logistic())
    stale = acc < target and _accuracy(model, x, y, train_mode=True) >= target
    yield Result(f"held-out accuracy >= {target:.3f} (recomputed here on the 450 held-out digits)", acc >= target,
                 detail=f"{acc:.3f}",
                 hint=("with batch statistics the model would pass: its BatchNorm running averages do not match "
                       "the weights (reset, or never updated in training). Train in model.train() so BatchNorm "
                       "updates them, and keep them in the state you pass") if stale else
                      "train longer or with a better learning rate (linear scaling + warm-up for large batches); "
                      "check the loss goes down in the run record")


@exercise("finance_milestone")
def _finance_milestone(answer, grader):
    import torch

    from ..projects.finance import task as finance
    from ..projects.runner import load_state

    task, summary, state = _unpack(answer)
    yield from _run_checks(summary, FINANCE_BUDGET_S)
    no_look_ahead = str(getattr(task, "train_end", "")) <= "2012-12-31"
    yield Result("calibrated on the training years only (no look-ahead)", no_look_ahead,
                 detail=f"train_end {getattr(task, 'train_end', None)}",
                 hint="keep train_end at or before 2012-12-31: the test years start after it, and a volatility "
                      "estimated on them leaks the future into the model")
    costs = getattr(task, "cost", 0) >= 0.002
    yield Result("hedging with transaction costs (>= 20 bp)", costs, detail=f"cost {getattr(task, 'cost', None)}",
                 hint="the milestone is hedging with costs (HedgingTask(cost=0.002)): without them the "
                      "Black-Scholes delta is already near-optimal and there is nothing to beat")
    # the check's own held-out paths: its own stream and the calibration recomputed from the prices
    vol = finance._hist_vol("2012-12-31")
    g = torch.Generator().manual_seed(20121231)
    dt = 1 / finance.TRADING_DAYS
    z = torch.randn(8192, task.days, generator=g)
    paths = torch.cat([torch.ones(len(z), 1), torch.exp(torch.cumsum(-0.5 * vol ** 2 * dt + vol * math.sqrt(dt) * z, 1))], 1)
    payoff = (paths[:, -1] - 1).clamp_min(0)
    model = load_state(task, state).eval()
    with torch.no_grad():
        rmse = float(torch.sqrt(((model(paths) - payoff) ** 2).mean()))
    tau = (task.days - torch.arange(task.days, dtype=torch.float32)) / finance.TRADING_DAYS
    bs = finance.hedge_pnl(paths, finance.bs_delta(paths[:, :-1], 1.0, tau, vol),
                           finance.bs_call_price(1.0, 1.0, task.days / finance.TRADING_DAYS, vol), 1.0, task.cost)
    bs_rmse = float(torch.sqrt(((bs - payoff) ** 2).mean()))
    yield Result("beats the Black-Scholes delta on 8,192 held-out paths (RMS hedging error, recomputed here)",
                 rmse < 0.97 * bs_rmse, detail=f"{rmse:.5f} vs Black-Scholes {bs_rmse:.5f}",
                 hint="an untrained HedgeNet is the Black-Scholes hedge: train it (the run's eval_loss should fall "
                      "below the target), with enough paths per step and warm-up")
