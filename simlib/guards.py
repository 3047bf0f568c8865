"""What the training loop refuses: bad arguments, batches of the wrong size, non-finite losses and gradients.

One function per kind of input, each raising ``ValueError`` (a :class:`NonFiniteError` for divergence) with one
line that names the field, the value and what to use instead:

    check_optim(cfg)           every field of simlib.train.OptimConfig (called by its __post_init__)
    check_plan_fields(plan)    Plan's fields beyond the mesh sizes (checkpoint_every, bucket_cap_mb, ...)
    check_run_args(...)        train()'s budget and loop arguments (steps, tokens, eval_every, nonfinite, ...)
    check_batch(...)           a task's batch has the declared number of rows (else DP would silently drop some)
    nonfinite(...)             did this step's loss or gradients hold NaN/inf on any rank (one agreed answer)
    run_meta(...)              what a checkpoint records about the run (task, plan, optimizer), to refuse a mismatch

Non-finite steps: ``train(..., nonfinite="stop")`` (the default) raises :class:`NonFiniteError` naming the step and
the ranks before the optimizer touches the weights; ``nonfinite="skip"`` skips that step's update (as
``torch.amp.GradScaler`` and Megatron-LM's skipped iterations do) and counts it in the summary.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from contextlib import nullcontext

import torch
import torch.distributed as dist

NONFINITE_MODES = ("stop", "skip")


class NonFiniteError(FloatingPointError):
    """The loss or the gradients of a step held NaN or inf (training diverged)."""


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def check_optim(cfg) -> None:
    """Every field of an ``OptimConfig``; raise ``ValueError`` naming the first wrong one."""
    c = type(cfg).__name__
    if cfg.name not in ("adamw", "sgd"):
        raise ValueError(f"{c}.name {cfg.name!r} is unknown: use 'adamw' or 'sgd'")
    if cfg.schedule not in ("cosine", "constant"):
        raise ValueError(f"{c}.schedule {cfg.schedule!r} is unknown: use 'cosine' or 'constant'")
    if not _is_real(cfg.lr) or not cfg.lr > 0:
        raise ValueError(f"{c}.lr must be a finite number > 0, got {cfg.lr!r}")
    if not _is_real(cfg.weight_decay) or cfg.weight_decay < 0:
        raise ValueError(f"{c}.weight_decay must be a number >= 0, got {cfg.weight_decay!r}")
    betas = cfg.betas
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_is_real(b) and 0 <= b < 1 for b in betas):
        raise ValueError(
            f"{c}.betas must be two numbers in [0, 1) (Adam's moment decays, e.g. (0.9, 0.95)), got {betas!r}"
        )
    if not _is_real(cfg.momentum) or not 0 <= cfg.momentum < 1:
        raise ValueError(f"{c}.momentum must be in [0, 1), got {cfg.momentum!r}")
    if not _is_int(cfg.warmup_steps) or cfg.warmup_steps < 0:
        raise ValueError(f"{c}.warmup_steps must be an int >= 0, got {cfg.warmup_steps!r}")
    if cfg.decay_steps is not None and (not _is_int(cfg.decay_steps) or cfg.decay_steps < 1):
        raise ValueError(f"{c}.decay_steps must be None (the step budget) or an int >= 1, got {cfg.decay_steps!r}")
    if not _is_real(cfg.min_lr_ratio) or not 0 <= cfg.min_lr_ratio <= 1:
        raise ValueError(
            f"{c}.min_lr_ratio must be in [0, 1] (the final lr as a fraction of lr), got {cfg.min_lr_ratio!r}"
        )
    if cfg.grad_clip is not None and (not _is_real(cfg.grad_clip) or not cfg.grad_clip > 0):
        raise ValueError(
            f"{c}.grad_clip must be None (no clipping) or a number > 0 (the largest gradient norm), "
            f"got {cfg.grad_clip!r}"
        )


# each project's task fields: ints >= 1, ints >= 0, True/False, numbers in a range ((low, high): low < v <= high,
# or low <= v when the low end is given as a list), dates
TASK_FIELDS = {
    "GPTTask": dict(
        positive=("seq_len", "hidden", "num_layers", "num_heads", "global_batch", "eval_windows", "moe_top_k"),
        counts=("seed", "moe_experts"),
        numbers={"moe_capacity_factor": (0, math.inf), "moe_aux_coeff": ([0], math.inf)},
    ),
    "DigitsTask": dict(
        positive=("global_batch", "image_size", "width", "blocks_per_stage"),
        counts=("seed",),
        flags=("augment",),
        numbers={"holdout": (0, 1 - 1e-9)},
    ),
    "HedgingTask": dict(
        positive=("global_batch", "days", "block", "hidden", "depth"),
        counts=("seed",),
        numbers={"cost": ([0], 0.1 - 1e-12)},
        dates=("train_end",),
    ),
}


def check_task(task) -> None:
    """Every field of a project's task (:data:`TASK_FIELDS`), before anything is built or launched: one line
    naming the first wrong one (a size of 0 would otherwise surface as a torch error, or at the first evaluation)."""
    c = type(task).__name__
    spec = TASK_FIELDS.get(c, {})
    for name in spec.get("positive", ()):
        v = getattr(task, name)
        if not _is_int(v) or v < 1:
            raise ValueError(f"{c}.{name} must be an int >= 1, got {v!r}")
    for name in spec.get("counts", ()):
        v = getattr(task, name)
        if not _is_int(v) or v < 0:
            raise ValueError(f"{c}.{name} must be an int >= 0, got {v!r}")
    for name in spec.get("flags", ()):
        if not isinstance(getattr(task, name), bool):
            raise ValueError(f"{c}.{name} must be True or False, got {getattr(task, name)!r}")
    for name, (low, high) in spec.get("numbers", {}).items():
        v, closed = getattr(task, name), isinstance(low, list)
        lo = low[0] if closed else low
        if not _is_real(v) or not (lo <= v if closed else lo < v) or v > high:
            where = (f">= {lo:g}" if closed else f"> {lo:g}") + (f" and < {high:.3g}" if high < math.inf else "")
            raise ValueError(f"{c}.{name} must be a number {where}, got {v!r}")
    for name in spec.get("dates", ()):
        v = getattr(task, name)
        import numpy as np

        try:
            if not isinstance(v, str):
                raise ValueError(v)
            np.datetime64(v, "D")
        except ValueError:
            raise ValueError(f"{c}.{name} must be a date 'YYYY-MM-DD', got {v!r}") from None
    if c == "GPTTask":
        if task.hidden % task.num_heads:
            ok = [h for h in range(1, task.hidden + 1) if task.hidden % h == 0][:8]
            raise ValueError(
                f"GPTTask.hidden {task.hidden} is not a multiple of num_heads {task.num_heads}: use num_heads in {ok}"
            )
        if task.moe_experts and task.moe_top_k > task.moe_experts:
            raise ValueError(f"GPTTask.moe_top_k {task.moe_top_k} must be between 1 and moe_experts {task.moe_experts}")


def check_held_out(task) -> None:
    """A GPT task's ``seq_len`` leaves at least one held-out window to evaluate on (else the first evaluation,
    after training, would fail)."""
    if task.data.eval_windows < 1:
        tokens = len(task.data.held_out)
        raise ValueError(
            f"GPTTask.seq_len {task.seq_len} is longer than the held-out text ({tokens:,} tokens): "
            f"use seq_len <= {tokens - 1}"
        )


def check_plan_fields(plan) -> None:
    """The fields of a ``Plan`` that its own mesh checks do not cover."""
    if not _is_int(plan.checkpoint_every) or plan.checkpoint_every < 0:
        raise ValueError(f"Plan.checkpoint_every must be an int >= 0 (0: never), got {plan.checkpoint_every!r}")
    if not _is_real(plan.bucket_cap_mb) or not plan.bucket_cap_mb > 0:
        raise ValueError(f"Plan.bucket_cap_mb must be a number > 0, got {plan.bucket_cap_mb!r}")
    for name in ("activation_checkpointing", "sync_batchnorm", "sequence_parallel"):
        if not isinstance(getattr(plan, name), bool):
            raise ValueError(f"Plan.{name} must be True or False, got {getattr(plan, name)!r}")
    if (
        plan.checkpoint_dir is not None
        and not isinstance(plan.checkpoint_dir, (str, bytes))
        and not hasattr(plan.checkpoint_dir, "__fspath__")
    ):
        raise ValueError(f"Plan.checkpoint_dir must be a path or None, got {plan.checkpoint_dir!r}")


def check_run_args(
    steps=None,
    tokens=None,
    samples=None,
    seconds=None,
    eval_every=0,
    log_every=10,
    warmup=2,
    nonfinite="stop",
    target=None,
) -> None:
    """``train()``'s budget (exactly one of ``steps``/``tokens``/``samples``/``seconds``, > 0) and loop arguments."""
    given = {
        k: v for k, v in dict(steps=steps, tokens=tokens, samples=samples, seconds=seconds).items() if v is not None
    }
    if len(given) != 1:
        raise ValueError(
            "give exactly one budget: steps=, tokens=, samples= or seconds="
            + (f" (got {', '.join(given)})" if given else "")
        )
    ((name, value),) = given.items()
    if name == "seconds":
        if not _is_real(value) or not value > 0:
            raise ValueError(f"seconds must be a number > 0, got {value!r}")
    elif not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    for arg, v in (("eval_every", eval_every), ("log_every", log_every), ("warmup", warmup)):
        if not _is_int(v) or v < 0:
            raise ValueError(f"{arg} must be an int >= 0, got {v!r}")
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(
            f"nonfinite={nonfinite!r} is unknown: use 'stop' (raise at the first NaN/inf step) or "
            "'skip' (skip that step's update and count it)"
        )
    if target is not None and (not isinstance(target, dict) or not all(_is_real(v) for v in target.values())):
        raise ValueError(f"target must be a dict of metric -> number, e.g. {{'eval_loss': 4.0}}, got {target!r}")


def check_batch(
    x, y, expected: int, step: int, task_name: str, rank: int, what: str = "global batch", defer: bool = False
) -> str | None:
    """Refuse a batch whose rows differ from the declared count: data parallelism would drop or duplicate rows.

    ``defer=True`` (a rank's own part of the batch, which its peers do not see): return the message instead of
    raising, for :func:`nonfinite` to agree on with the peers after this step's backward (a part of another size
    runs the same collectives), so that every rank raises it together before the optimizer step; raised alone,
    the peers would wait in their next collective for a rank that has left."""
    for label, t in (("inputs", x), ("targets", y)):
        rows = t.shape[0] if hasattr(t, "shape") and len(t.shape) else None
        if rows != expected:
            problem = (
                f"rank {rank}, step {step}: task {task_name!r} returned a {what} of {rows} {label} "
                f"rows where {expected} were declared (global_batch): every batch must have exactly "
                "that size; fix task.batch() or the task's global_batch"
            )
            if defer:
                return problem
            raise ValueError(problem)
    return None


def fit_rows(x, y, expected: int):
    """``x`` and ``y`` cut or repeated to ``expected`` rows: a wrong-sized part (:func:`check_batch` with
    ``defer``) still runs the step's collectives with the shapes its peers use (micro-batches, pipeline sends), so
    that every rank reaches the agreement and raises; the step's result is never applied. A batch without rows to
    repeat is refused here, on this rank."""
    rows = x.shape[0] if hasattr(x, "shape") and len(x.shape) else 0
    if not rows or not (hasattr(y, "shape") and len(y.shape) and y.shape[0]):
        raise ValueError(f"a batch part without rows (inputs {getattr(x, 'shape', None)}): fix task.batch()")
    return tuple(t[torch.arange(expected) % t.shape[0]] for t in (x, y))


def agree_batch(wrong: str | None, device=None, flag: float = 0.0) -> float:
    """Every rank's answer to "was some rank's batch part of the wrong size?" (see :func:`check_batch`): raises
    the first such rank's ``ValueError`` on every rank; else returns the all-reduced maximum of ``flag`` (one
    all-reduce for both questions)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        if wrong:
            raise ValueError(wrong)
        return flag
    both = torch.tensor([flag, 1.0 if wrong else 0.0], device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if both[1].item():
        said = [None] * dist.get_world_size()
        dist.all_gather_object(said, wrong)
        first = next((s for s in said if s), None)
        if first is not None:  # (None only where the flag was not a real value: a device that computes nothing)
            raise ValueError(first)  # the first such rank's, on every rank
    return both[0].item()


def _local_bad(loss, params) -> tuple[bool, bool]:
    loss_bad = loss is not None and not math.isfinite(float(loss))
    grads = [p.grad for p in params if p.grad is not None]
    grad_bad = False
    if grads:
        norms = torch._foreach_norm(grads)
        grad_bad = not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())
    return loss_bad, grad_bad


def _data_bad(batch) -> bool:
    """Does this rank's batch itself hold NaN or inf (in any floating tensor of it)?"""
    tensors = batch if isinstance(batch, (tuple, list)) else (batch,)
    return any(torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors)


class Nonfinite(list):
    """What :func:`nonfinite` found: ``[(rank, loss_bad, grad_bad, data_bad), ...]`` for the ranks that saw a
    non-finite value (empty when all is finite), and ``finite_loss``: the ranks whose own loss was finite."""

    finite_loss: tuple = ()


def nonfinite(loss, params, norm=None, device=None, timeline=None, batch=None, wrong=None) -> Nonfinite:
    """Which ranks saw a non-finite loss or gradient this step: ``[(rank, loss_bad, grad_bad, data_bad), ...]``
    (empty when all is finite), the same answer on every rank. ``norm``: the global gradient norm when one was
    computed (clipping) - then only the loss needs checking locally. ``batch``: this rank's ``(x, y)``, looked at
    only on a bad step (did the data itself hold the NaN?). ``wrong``: this rank's deferred :func:`check_batch`
    message, agreed on in the same all-reduce (every rank raises it). One all-reduce of two numbers per step (a
    "comm" span of ``timeline`` when given: it blocks, so it is exposed communication)."""
    loss_bad, grad_bad = (
        loss is not None and not math.isfinite(float(loss)),
        norm is not None and not math.isfinite(norm),
    )
    if norm is None:
        loss_bad, grad_bad = _local_bad(loss, params)
    multi = dist.is_initialized() and dist.get_world_size() > 1
    if not multi:
        agree_batch(wrong)
        found = Nonfinite(
            [(0, loss_bad, grad_bad, batch is not None and _data_bad(batch))] if loss_bad or grad_bad else []
        )
        found.finite_loss = (0,) if loss is not None and not loss_bad else ()
        return found
    with timeline.span("comm", name="non-finite check") if timeline is not None else nullcontext():
        any_bad = agree_batch(wrong, device, 1.0 if (loss_bad or grad_bad) else 0.0)
    if not any_bad:
        return Nonfinite()
    everyone = [None] * dist.get_world_size()  # only on a bad step: who saw what, and whether the data held it
    mine = (dist.get_rank(), loss_bad, grad_bad, batch is not None and _data_bad(batch), loss is not None)
    dist.all_gather_object(everyone, mine)
    found = Nonfinite(e[:4] for e in everyone if e[1] or e[2] or e[3])
    found.finite_loss = tuple(e[0] for e in everyone if e[4] and not e[1])
    return found


def _ranks(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def nonfinite_message(step: int, bad, lr: float, last_checkpoint=None, grad_clip=None) -> str:
    """One line for a non-finite step: the rank(s) whose own loss went NaN/inf first (a local value, before any
    collective), then where the gradient all-reduce spread it; remedies that are not already in force. When the
    NaN began in one rank's data (its batch holds NaN/inf, or its loss alone is NaN while another rank's is
    finite), the data is named as the fault, with the rank and the batch: a lower lr or clipping cannot fix it."""
    origin = sorted(r for r, loss_bad, *_ in bad if loss_bad)
    spread = sorted(r for r, _, grad_bad, *_ in bad if grad_bad)
    in_data = sorted(e[0] for e in bad if len(e) > 3 and e[3])
    finite = sorted(getattr(bad, "finite_loss", ()) or ())
    kept = f"; the newest checkpoint is {last_checkpoint}" if last_checkpoint else ""
    stopped = f"stopped before the optimizer step, so the weights are those before step {step}{kept}"
    skip = "or pass nonfinite='skip' to skip such steps and count them"
    if in_data or (origin and finite):  # one rank's data: not the training's fault
        ranks = in_data or origin
        whose = " and ".join(f"the batch {_ranks([r])} trained on at step {step}" for r in ranks)
        if in_data:
            where = f"{whose} holds NaN or inf: the data is at fault, not the training"
        else:
            where = (
                f"the loss became NaN or inf on {_ranks(origin)} while {_ranks(finite)} computed a finite loss at "
                f"the same step: {whose} is what differs, so the data is the likely fault, not the training"
            )
        if [r for r in spread if r not in ranks]:
            where += f"; the gradient all-reduce then spread it to ranks {spread}"
        return (
            f"step {step}: {where}; {stopped}. Look at task.batch({step}) on {_ranks(ranks)} (NaN or inf in "
            f"the inputs or targets, values out of range?) and fix or drop those rows, {skip} (a lower lr or "
            "grad_clip cannot take a NaN out of the data)"
        )
    if origin:
        where = f"the loss became NaN or inf on rank(s) {origin} first (computed there, before any collective)"
        if [r for r in spread if r not in origin]:
            where += f"; the gradient all-reduce then spread it to rank(s) {spread}"
    else:
        where = (
            f"the gradients became NaN or inf on rank(s) {spread} while every loss was finite (after the "
            "all-reduce, which hands one rank's NaN to all: the rank it began on is not known)"
        )
    todo = [f"lower the lr (now {lr:.3g})"]
    if grad_clip is None:
        todo.append("set OptimConfig(grad_clip=1.0)")
    else:
        todo.append(f"a smaller grad_clip (now {grad_clip:g})")
    todo = ", ".join(todo) + f", {skip}"
    return f"step {step}: {where} (training diverged); {stopped}. {todo[0].upper()}{todo[1:]}"


def nonfinite_error(step: int, bad, lr: float, checkpoint_dir=None, grad_clip=None) -> NonFiniteError:
    """:class:`NonFiniteError` with :func:`nonfinite_message`, naming the newest checkpoint in ``checkpoint_dir``."""
    from .checkpoint import latest

    newest = latest(checkpoint_dir) if checkpoint_dir else None
    return NonFiniteError(nonfinite_message(step, bad, lr, newest.name if newest else None, grad_clip))


def _plain(value):
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (str, bool, int, float, type(None))) for v in value):
        return list(value)
    return None


def run_meta(task, plan, optim, horizon) -> dict:
    """What a checkpoint records about the run that wrote it: the task (type and simple fields), the plan, the
    optimizer and the schedule's horizon. Values that are not plain (arrays, modules) are left out."""

    def fields(obj) -> dict:
        raw = (
            {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            if dataclasses.is_dataclass(obj)
            else {k: v for k, v in vars(obj).items() if not k.startswith("_")}
        )
        return {k: _plain(v) for k, v in raw.items() if _plain(v) is not None or v is None}

    inner = getattr(task, "task", task)  # simlib.faults.KillAt wraps a task: record the task itself
    plan_fields = fields(plan)
    for transient in ("checkpoint_dir", "checkpoint_every"):
        plan_fields.pop(transient, None)
    return {
        "task": {"type": type(inner).__name__, **fields(inner)},
        "plan": plan_fields,
        "optim": {**fields(optim), "horizon": horizon},
    }


def free_changes(plan) -> tuple:
    """Fields of :func:`run_meta` that may change on resume without a flag: they do not change what is learned
    (how micro-batches are run) or the checkpoint reshards across them (the DP degree without ZeRO)."""
    free = [
        "plan.accumulation",
        "plan.dp_variant",
        "plan.schedule",
        "plan.bucket_cap_mb",
        "plan.activation_checkpointing",
    ]
    if not plan.zero_stage:
        free.append("plan.dp")
    return tuple(free)


def apply_optim(optimizer, scheduler, optim) -> None:
    """After a resume that allowed optimizer changes: the new lr, betas, weight decay and momentum take effect
    (a loaded state would otherwise keep the saved ones)."""
    groups = optimizer.param_groups
    for g in groups:
        g["initial_lr"] = optim.lr
        if "betas" in g:
            g["betas"] = tuple(optim.betas)
        if "momentum" in g:
            g["momentum"] = optim.momentum
        if g.get("weight_decay", 0.0) and optim.weight_decay != g["weight_decay"]:
            g["weight_decay"] = optim.weight_decay
    scheduler.base_lrs = [optim.lr for _ in groups]
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for g, f in zip(groups, factors):
        g["lr"] = optim.lr * f
    scheduler._last_lr = [g["lr"] for g in groups]
