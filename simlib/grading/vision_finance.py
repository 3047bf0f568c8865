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

What can still be faked: times edited consistently by less than :data:`.rerun.ABSOLUTE_TOL` (there is no rival plan
to compare with, and load between the run and the check moves the time); a run that follows the standard settings
for the re-run's steps and deviates after; on a GPU, a one-process run relabelled in every field (its losses agree
to :data:`.rerun.LOSS_RTOL`). Vision: a model trained on the held-out digits as well (they ship with scikit-learn;
:mod:`.heldout` says why no check can see it at this size). Finance's held-out paths are drawn at check time, so its
evaluation data cannot be trained on.

The answer itself is opened only in a worker (:func:`_answer_harness`): there the record's fields are read and
turned into plain data (JSON values) and the weights into plain tensors, so a property of the record or a method
of the state runs there, never in the process that computes the verdict.
"""

from __future__ import annotations

from .core import TODO, Result, exercise
from .evidence import check_consistent, check_first_loss, check_world_size, load_fixed
from .rerun import check_losses, check_spans, check_time, record_threads, replay, time_ratio

VISION_BUDGET_S = 60.0  # seconds of training (the record's train_time): evaluation not counted
FINANCE_BUDGET_S = 60.0


def _unpack(answer):
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise TypeError(
            f"the answer is the tuple (task, record, state) from run_project / train_on, got {type(answer).__name__}"
        )
    task, record, state = answer
    summary, rows, evals = (
        getattr(record, "summary", None),
        getattr(record, "rows", None),
        getattr(record, "evals", None),
    )
    if not (isinstance(summary, dict) and isinstance(rows, list) and isinstance(evals, list)):
        raise TypeError("expected (task, RunRecord, state_dict): pass the record and the weights train_on returned")
    return task, record, state


def _answer_harness(answer):
    """In a worker: None when the milestone is not answered, else (record as plain JSON values, the weights as
    {name: plain tensor} or None, the weights' type name). Raises on an answer of another shape."""
    import json

    from ..plain import exact_str
    from .evidence import tensor_state

    if _not_done(answer):
        return None
    _, record, state = _unpack(answer)
    fields = dict(summary=record.summary, rows=record.rows, evals=record.evals)

    def jsonable(o):  # a NumPy or 0-d torch number as a number; anything else as its repr (which fails the checks)
        return o.item() if getattr(o, "ndim", None) == 0 and hasattr(o, "item") else repr(o)

    return json.loads(json.dumps(fields, default=jsonable)), tensor_state(state), exact_str(type(state).__name__)


def _opened(answer, grader):
    """(record, tensors, type name) of the answer, read in a worker; None when not answered."""
    from types import SimpleNamespace

    got = grader.ask(_answer_harness, answer, what="your answer")
    return None if got is None else (SimpleNamespace(**got[0]), got[1], got[2])


def _run_checks(record, budget, global_batch, world_size=2):
    summary, rows = record.summary, record.rows
    yield check_world_size(summary, world_size)
    yield check_consistent(rows, record.evals, summary, global_batch)
    t = max([summary.get("train_time") or 0.0] + [r.get("train_time") or 0.0 for r in rows]) or float("inf")
    yield Result(
        f"within the time budget ({budget:g} s of training)",
        t <= budget,
        detail=f"{t:.1f} s",
        hint="fewer steps, a larger learning rate with warm-up, or a smaller image size",
    )


def _rerun_standard(name, record, grader):
    """The first steps of the project's standard 2-process plan re-run on the grader's workers (:mod:`.rerun`)."""
    from ..plan import Plan
    from ..projects.registry import get

    cfg = _standard(name)
    plan = Plan(dp=2, **get(name).plan_defaults({"dp": 2}))
    replayed = replay(
        grader,
        cfg["task"],
        plan,
        cfg["optim"],
        cfg["steps"],
        record.rows,
        record_threads(record.summary),
        record.summary.get("device", "cpu"),
    )
    what = f"the standard 2-process plan ({plan.label})"
    yield check_losses(name, record.rows, replayed, what, record.summary.get("device", "cpu"))
    yield check_spans(name, record.rows, replayed, what)
    yield check_time(name, time_ratio(record.rows, replayed), {}, what)


def _same_eval(record, key, recomputed, tol, what):
    last = record.evals[-1]["eval"].get(key) if record.evals else None
    ok = isinstance(last, (int, float)) and abs(last - recomputed) <= tol
    return Result(
        f"the record's last evaluation is what these weights score ({what})",
        ok,
        "the weights and the record do not come from the same run (or the record was edited): pass the "
        "record and the state that one train_on / run_project call returned",
        f"recorded {last}, recomputed {recomputed:.5f}",
    )


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


def _standard(name):
    """The project's standard task and target for this mode (quick or full): the check's fixed arguments."""
    from ..env import quick
    from ..projects.runner import PROJECTS

    return PROJECTS[name](quick())


def _not_done(answer):
    if answer is None or answer == () or answer == "":
        return Result(
            "the milestone is answered",
            False,
            status=TODO,
            hint="not done yet: run the project's 2-process run and pass (task, record, state)",
        )
    return None


def _then_rerun(name, checks, record, grader):
    """``checks``, then (when every one passed) the re-run of the standard plan: a verdict already failed needs no
    re-run, and a grading run spends its seconds on answers that could pass."""
    ok = True
    for result in checks:
        ok = ok and result.passed
        yield result
    if ok:
        yield from _rerun_standard(name, record, grader)


@exercise("vision_milestone")
def _vision_milestone(answer, grader):
    opened = _opened(answer, grader)
    if opened is None:
        yield _not_done(None)
        return
    yield from _then_rerun("vision", _vision_checks(*opened), opened[0], grader)


def _vision_checks(record, state, got):
    from ..env import quick
    from ..projects.vision import baseline_logistic

    std = _standard("vision")["task"]  # the grader's own task: fixed sizes, the fixed split, seed 0
    yield from _run_checks(record, VISION_BUDGET_S, std.global_batch)
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
    yield _same_eval(record, "accuracy", acc, 1.5 / len(y), f"accuracy on the {len(y)} held-out digits")
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
    opened = _opened(answer, grader)
    if opened is None:
        yield _not_done(None)
        return
    yield from _then_rerun("finance", _finance_checks(*opened), opened[0], grader)


def _finance_checks(record, state, got):
    import torch

    # the grader's own task: calibrated to 2012-12-31, 20 bp costs, the standard sizes and seed
    std = _standard("finance")["task"]
    yield from _run_checks(record, FINANCE_BUDGET_S, std.global_batch)
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
        yield _same_eval(record, "eval_loss", sim, 1e-6 + 1e-4 * sim, "eval_loss on the project's test paths")
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
