"""Milestones of the hands-on projects: the check rebuilds the model and the data and recomputes the metric.

The answer is what the project's run returns, ``(task, record, state)``: the Task trained, the run record,
and rank 0's trained weights (``simlib.projects.runner.train_on`` / ``run_project``). The check never runs the
learner's model code and never reads the learner's task: it builds the project's model with the standard run's
fixed sizes (``vision_run`` / ``finance_run`` for this mode), loads only the weights (tensors), builds the held-out
data with its own code (vision: the 450 held-out digits of the fixed split; finance: 8,192 paths simulated with a
seed drawn at check time, which the learner's code never sees, hedged by the grader's HedgeNet whose features at
each day are known on that day), and checks the record against what it recomputes (:mod:`.evidence`): the
step-0 loss, the last evaluation, the world size across every field the trainer wrote, and the budget.

Issue 33, family 7: the plan and the time are not taken on the record's word. The check re-runs the first steps
of the standard 2-process plan on its own workers with the course's trainer (:mod:`.rerun`): the record's losses
over those steps, the kinds of its per-step spans and its step time (within :data:`.rerun.ABSOLUTE_TOL`) must be
what the re-run shows (on the CPU the losses to the plan's rounding: a one-process run relabelled as two shows).
Issue 47, item 4: then the whole recorded run is re-run there and its final weights and buffers must be the
answer's (:func:`.milestones.check_run_length`): weights trained longer than the record says, and BatchNorm
statistics recomputed on the held-out digits, fail. The shared machinery and each project's budget (its
``MILESTONE``) are :mod:`.milestones`'.

What can still be faked: times edited consistently by less than :data:`.rerun.ABSOLUTE_TOL` (there is no rival plan
to compare with, and load between the run and the check moves the time); on a GPU, a one-process run relabelled in
every field (its losses agree to :data:`.rerun.LOSS_RTOL`) and weights within
:data:`.milestones.GPU_WEIGHT_RTOL` of the run's. A model trained on the held-out digits as well is now a model
other than the standard run's, which the whole re-run tells apart. Finance's held-out paths are drawn at check
time, so its evaluation data cannot be trained on.

The answer itself is opened only in a worker (:func:`.milestones.open_answer`): there the record's fields are read and
turned into plain data (JSON values) and the weights into plain tensors, so a property of the record or a method
of the state runs there, never in the process that computes the verdict.
"""

from __future__ import annotations

from .core import Result, exercise
from .evidence import check_first_loss, load_fixed
from .milestones import not_done, open_answer, run_checks, same_eval, spec_of, standard, then_rerun


def vision_heldout(image_size: int, holdout: float = 0.25):
    """The check's own held-out digits: sklearn's split (stratified, seed 0), bilinear upscale, no augmentation."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    _, x_te, _, y_te = train_test_split(
        d.images.astype(np.float32) / 16.0, d.target, test_size=holdout, random_state=0, stratify=d.target
    )
    x = F.interpolate(
        torch.from_numpy(x_te).unsqueeze(1), size=(image_size, image_size), mode="bilinear", align_corners=False
    )
    return (x - 0.3) / 0.4, torch.from_numpy(y_te).long()


def _accuracy(model, x, y, train_mode=False):
    import torch

    model.train(train_mode)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


@exercise("vision_milestone")
def _vision_milestone(answer, grader):
    opened = open_answer(answer, grader)
    if opened is None:
        yield not_done(None)
        return
    yield from then_rerun("vision", _vision_checks(*opened), opened[0], opened[1], grader)


def _vision_checks(record, state, got):
    from ..env import quick
    from ..projects.vision import baseline_logistic

    std = standard("vision")["task"]  # the grader's own task: fixed sizes, the fixed split, seed 0
    yield from run_checks(record, spec_of("vision")["budget_s"], std.global_batch)
    yield check_first_loss(
        record.rows,
        std,
        f"DigitsTask(global_batch={std.global_batch}, image_size={std.image_size}, width={std.width}, holdout=0.25)",
    )
    model, fit = load_fixed(std.build_model(), state, f"ResNet(width={std.width})", got)
    yield fit
    if model is None:
        return
    x, y = vision_heldout(std.image_size)
    acc = _accuracy(model, x, y)
    yield same_eval(record, "accuracy", acc, 1.5 / len(y), f"accuracy on the {len(y)} held-out digits")
    target = 0.90 if quick() else max(0.97, baseline_logistic())
    stale = acc < target and _accuracy(model, x, y, train_mode=True) >= target
    yield Result(
        f"held-out accuracy >= {target:.3f} (recomputed here on the {len(y)} held-out digits)",
        acc >= target,
        detail=f"{acc:.3f}",
        hint=(
            "with batch statistics the model would pass: its BatchNorm running averages do not match "
            "the weights (reset, or never updated in training). Train in model.train() so BatchNorm "
            "updates them, and keep them in the state you pass"
        )
        if stale
        else "train longer or with a better learning rate (linear scaling + warm-up for large batches); "
        "check the loss goes down in the run record",
    )


def finance_heldout(std, n: int = 8192):
    """Held-out paths simulated here from a seed drawn now (never seen by the learner's code), their payoff,
    and the Black-Scholes delta's hedged value on them (the training years' volatility, the project's cost)."""
    import secrets

    paths = std.simulate(n, (secrets.randbelow(2**31), 11))
    return paths, std.payoff(paths), std.bs_hedge(paths)


@exercise("finance_milestone")
def _finance_milestone(answer, grader):
    opened = open_answer(answer, grader)
    if opened is None:
        yield not_done(None)
        return
    yield from then_rerun("finance", _finance_checks(*opened), opened[0], opened[1], grader)


def _finance_checks(record, state, got):
    import torch

    # the grader's own task: calibrated to 2012-12-31, 20 bp costs, the standard sizes and seed
    std = standard("finance")["task"]
    yield from run_checks(record, spec_of("finance")["budget_s"], std.global_batch)
    yield check_first_loss(
        record.rows,
        std,
        f"HedgingTask(days={std.days}, cost={std.cost}, train_end={std.train_end!r}, global_batch={std.global_batch})",
    )
    # the grader's HedgeNet: each day's features (log-moneyness, time left, delta, yesterday's holding) are
    # known on that day; the volatility and the cost are the grader's, not the learner's
    model, fit = load_fixed(std.build_model(), state, f"HedgeNet(days={std.days}, hidden={std.hidden})", got)
    yield fit
    if model is None:
        return
    model.eval()
    with torch.no_grad():
        recorded_paths = std.test_paths()
        sim = float(torch.mean((model(recorded_paths) - std.payoff(recorded_paths)) ** 2))
        yield same_eval(record, "eval_loss", sim, 1e-6 + 1e-4 * sim, "eval_loss on the project's test paths")
        paths, payoff, bs = finance_heldout(std)
        rmse = float(torch.sqrt(((model(paths) - payoff) ** 2).mean()))
    bs_rmse = float(torch.sqrt(((bs - payoff) ** 2).mean()))
    yield Result(
        f"beats the Black-Scholes delta on {len(paths):,} paths simulated here (RMS hedging error)",
        rmse < 0.97 * bs_rmse,
        detail=f"{rmse:.5f} vs Black-Scholes {bs_rmse:.5f}",
        hint="the check runs its own HedgeNet on your weights, on paths from a seed drawn now: an untrained "
        "HedgeNet is the Black-Scholes hedge. Train it on the standard task (the run's eval_loss "
        "should fall below the target), with enough paths per step and warm-up",
    )


from . import finance_pieces  # noqa: E402,F401 - registers the finance project's pieces' checks
from .pieces_milestone import pieces_milestone  # noqa: E402

pieces_milestone("finance")  # "finance_pieces_milestone": finance_milestone, trained with the learner's pieces
