"""Does ``simlib train`` run a plan the simulator priced? :func:`trainer_plan` builds the trainer's ``Plan`` from a
:class:`~simlib.sim.Strategy`, lets the trainer's own check refuse it, and maps it back with the one Plan ->
Strategy mapping: a field that does not come back is one the trainer has no knob for, and is named."""

from __future__ import annotations

import dataclasses


def _first_line(exc) -> str:
    text = str(exc).split(":")[0] if ":" in str(exc)[:80] else str(exc)
    return " ".join(text.split())[:120]


def _trainer_bucket_bytes() -> float:
    from ..train import Plan

    return next(f.default for f in dataclasses.fields(Plan) if f.name == "bucket_cap_mb") * 2**20


def trainer_plan(s, global_batch: int, world: int, task=None, cache: dict | None = None):
    """(the ``simlib.train.Plan`` that runs strategy ``s``, None) or (None, why ``simlib train`` cannot).

    The Plan is built from ``s``, checked by ``Plan.validate(world, task)`` (the trainer's one check) and mapped
    back by ``Strategy.from_plan`` (the one Plan -> Strategy mapping): it runs ``s`` only if that gives ``s``
    back, field for field. A field that differs is one the trainer has no knob for (FSDP, selective
    recomputation, interleaving, ...) and is named. ``cache``: answers of one search (same task, batch, world)."""
    from ..train import Plan

    if cache is not None and s in cache:
        return cache[s]
    m = s.num_micro_batches
    fields_ = dict(
        dp=s.dp,
        tp=s.tp,
        pp=s.pp,
        sequence_parallel=s.sequence_parallel,
        accumulation=m if s.pp == 1 else 1,
        pp_microbatches=m if s.pp > 1 else None,
        schedule=s.schedule if s.schedule in ("1f1b", "gpipe") else "1f1b",
        mixed_precision=None if s.dtype == "fp32" else s.dtype,
        activation_checkpointing=s.recompute == "full",
        zero_stage=s.zero_stage,
        dp_variant="bucket" if s.overlap or s.dp == 1 else "flat",
        bucket_cap_mb=s.bucket_bytes / 2**20,
    )
    fields_.update({k: getattr(s, k) for k in ("cp", "ep") if getattr(s, k, 1) > 1})
    try:
        p = Plan(**fields_)
        if task is not None:
            import copy

            task = copy.copy(task)
            task.global_batch = global_batch  # the search's batch (a task's own is checked by the trainer too)
        p.validate(world, task)
        back = type(s).from_plan(p, global_batch, **{k: getattr(s, k) for k in _NOT_IN_PLAN})
    except (ValueError, TypeError) as exc:
        out = (None, "simlib train refuses it: " + _first_line(exc))
    else:
        diff = [f.name for f in dataclasses.fields(s) if getattr(s, f.name) != getattr(back, f.name)]
        out = (
            (p, "")
            if not diff
            else (None, "simlib train has no knob for " + ", ".join(f"{k}={getattr(s, k)!r}" for k in diff))
        )
    if cache is not None:
        cache[s] = out
    return out


# Strategy fields a Plan does not say (from_plan's overrides): how the machine runs, not how the work is split
_NOT_IN_PLAN = ("optimizer", "threads", "attention", "kernels", "tp_across_nodes", "reduce_dtype", "head")
