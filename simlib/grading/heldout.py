"""Held-out text the learner cannot aim at: windows drawn at check time from a grader-private seed.

The GPT project evaluates on fixed windows (the first ``eval_windows`` windows of the held-out split), so a learner
who trains on them gets a low recorded loss and reaches the target early. The held-out text ships with the course,
so the grader cannot hide it; it looks for the trace such training leaves instead. It draws :data:`WINDOWS` windows
at random offsets in the whole held-out split (``secrets``: a seed nobody saw) and compares the weights' mean loss on
them with their loss on the fixed windows: a model that saw the fixed windows does far better on them. Allowed:
:data:`SIGMAS` standard errors of the difference (from the windows' own spread) plus :data:`MARGIN`.

Measured (GPT quick, runs of dp, tp and one process, 10 steps): the fixed windows' loss minus the fresh windows'
was -0.15 to -0.13 nats (the fixed windows happen to be easier text), inside the allowance of about 0.4 (16 fixed
windows are a small sample); 20 steps on the fixed windows made it -3.0.

What this cannot see: training on the held-out split as a whole. Measured at the same size, 10 or 40 extra steps on
random held-out windows lowered the held-out loss 0.11-0.12 nats more than the training loss (honest runs: within
0.022 either way), and telling that from the sampling noise at 4 standard errors takes about 4,000 windows of each
split (a minute of grading here under load): not done. The vision project's digits ship with scikit-learn and their
trace is fainter still: an honest run's loss on 450 held-out digits (warped afresh) is 0.03-0.05 nats above its loss
on 450 training digits; 200 more steps on the held-out digits turn that into -0.03, while 450 digits' sampling noise
alone needs about 0.13 nats (4 standard errors). Finance draws its held-out paths at check time already.

The vision and finance milestones no longer need such a trace: they re-run the whole recorded run on the grader's
workers and require the answer's final weights and buffers to be that run's (:func:`.milestones.check_run_length`),
so weights trained on the held-out digits too, trained longer, or with BatchNorm statistics recomputed on them are
not (issue 47, item 4). ``gpt_plan`` still relies on the trace above: its weights are unsplit from a TP or PP run
and its runs are the longest to repeat.
"""

from __future__ import annotations

import math
import secrets

from .core import Result

WINDOWS = 256  # fresh held-out windows (at least 4x the fixed ones)
SIGMAS = 4.0  # standard errors of the difference of the two means allowed
MARGIN = 0.05  # nats, for the text: the fixed windows are one stretch of it, the fresh ones the whole split


def _window_losses(task, model, stream, starts):
    import torch
    import torch.nn.functional as F

    t = task.seq_len
    windows = torch.stack([torch.as_tensor(stream[s : s + t + 1].astype("int64")) for s in starts])
    out = []
    model.eval()
    with torch.no_grad():
        for i in range(0, len(windows), 64):
            w = windows[i : i + 64]
            logits = model(w[:, :-1])
            loss = (
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1), reduction="none")
                .reshape(len(w), -1)
                .mean(1)
            )
            out.extend(float(x) for x in loss)
    return out


def _mean_se(xs):
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def gpt_losses(task, model, windows: int | None = None, seed: int | None = None) -> dict:
    """The weights' loss (nats per token; mean, standard error) on the fixed evaluation windows and on ``windows``
    held-out windows drawn at random offsets from ``seed`` (default: a seed drawn now)."""
    import numpy as np

    data = task.data
    n = windows or max(WINDOWS, 4 * data.eval_windows)
    rng = np.random.default_rng(secrets.randbits(64) if seed is None else seed)
    t = task.seq_len
    fixed = [i * t for i in range(data.eval_windows)]
    fresh = rng.integers(0, len(data.held_out) - t - 1, n).tolist()
    return {
        "fixed": _mean_se(_window_losses(task, model, data.held_out, fixed)),
        "fresh": _mean_se(_window_losses(task, model, data.held_out, fresh)),
    }


def check_gpt_heldout(name: str, task, model, seed: int | None = None) -> Result:
    """The saved weights do not find the fixed evaluation windows easier than held-out windows drawn now."""
    tr = gpt_losses(task, model, seed=seed)
    gap = tr["fresh"][0] - tr["fixed"][0]
    allowed = SIGMAS * math.hypot(tr["fixed"][1], tr["fresh"][1]) + MARGIN
    return Result(
        f"{name}: the weights were not trained on the evaluation windows (held-out windows drawn now)",
        gap <= allowed,
        "the weights learned the held-out text itself: the project's evaluation windows were in the "
        "training data. Train on the project's training split only (task.batch) and let the evaluation "
        "measure text the model never saw",
        f"loss on the fixed evaluation windows {tr['fixed'][0]:.3f}, on held-out windows drawn now "
        f"{tr['fresh'][0]:.3f}: {gap:+.3f} nats easier (allowed {allowed:.3f})",
    )
