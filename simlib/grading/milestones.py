"""A project's milestone, from the spec its folder declares: the checks every project milestone shares.

A project declares its milestone in its ``run.py`` (``MILESTONE``, read through :mod:`simlib.projects.registry`)::

    MILESTONE = dict(
        metric="eval_loss",   # the key of task.evaluate(model) the target is on (the standard run's target)
        lower_is_better=True,  # eval_loss: at most the target; accuracy: at least
        budget_s=60.0,         # seconds of training (the record's train_time; evaluation not counted)
        world_size=2,          # the processes the milestone's run uses (default 2)
        plan={"tp": 2},        # optional: the milestone run's Plan fields (default: data parallel on world_size)
    )

and :func:`milestone` turns it into the graded exercise ``"<name>_milestone"``, whose answer is what the project's
run returns, ``(task, record, state)`` (``run_project(name, 2)``). The checks never run the learner's model code and
never read the learner's task: they build the project's standard task themselves (the registered ``settings`` for
this mode), load only the weights (tensors) into its freshly built model, recompute the metric with the task's own
evaluation, and check the record against what they recompute (:mod:`.evidence`): the world size in every field,
the rows' consistency, the time budget, the step-0 loss, the last evaluation. Then, on the grader's own workers with
the course's trainer:

- the first steps of the standard plan re-run (:mod:`.rerun`: losses, spans, step time);
- the **whole recorded run** re-run (:func:`check_run_length`): as many steps as the record says it trained, and the
  final weights and buffers compared with the answer's. Weights from a longer run than the record's, or any change
  made to them after training (BatchNorm statistics recomputed on the held-out split, weights averaged with another
  run's) are not what that run makes (issue 47, item 4). On the CPU the same plan reproduces its weights bit for
  bit (:data:`WEIGHT_RTOL`); on a GPU only to :data:`GPU_WEIGHT_RTOL`.

:mod:`.vision_finance` adds each project's own held-out data to these (the digits' fixed split, paths simulated
at check time).
"""

from __future__ import annotations

from .core import TODO, Result, exercise
from .evidence import check_consistent, check_first_loss, check_world_size, load_fixed

# Weights. The record's run and the grader's re-run are the same trainer, plan, data and thread count: on the CPU
# bitwise equal (measured: every tensor of the vision and finance quick runs, 2 Gloo ranks); the tolerance only
# absorbs a different BLAS path on another CPU. GPU kernels need not be deterministic: 100 steps apart, weights differ
# by about the learning rate's step; GPU_WEIGHT_RTOL still tells a run twice as long or statistics recomputed.
WEIGHT_RTOL = 1e-5
GPU_WEIGHT_RTOL = 5e-2


def spec_of(name: str) -> dict:
    """The project's milestone spec with its defaults (ValueError: the project declares none)."""
    from ..projects.registry import get

    spec = get(name).milestone
    if spec is None:
        raise ValueError(f"project {name!r} declares no MILESTONE in {get(name).module}: add one to grade it")
    unknown = sorted(set(spec) - {"metric", "lower_is_better", "budget_s", "world_size", "plan"})
    if unknown or "metric" not in spec:
        raise ValueError(
            f"project {name!r}'s MILESTONE: {'unknown keys ' + str(unknown) if unknown else 'no metric'}: it "
            "holds metric, lower_is_better, budget_s, world_size, plan"
        )
    spec = {"lower_is_better": True, "budget_s": 60.0, "world_size": 2, **spec}
    if spec.get("plan"):
        from ..plan import Plan

        ranks = Plan(**spec["plan"]).world_size
        if ranks != spec["world_size"]:
            raise ValueError(
                f"project {name!r}'s MILESTONE: its plan {spec['plan']} uses {ranks} ranks, its world_size says "
                f"{spec['world_size']}: make them agree"
            )
    return spec


def standard(name: str) -> dict:
    """The project's standard run for this mode (quick or full): the checks' fixed task, optimizer and budget."""
    from ..env import quick
    from ..projects.registry import get

    return get(name).settings(quick())


def not_done(answer):
    if answer is None or answer == () or answer == "":
        return Result(
            "the milestone is answered",
            False,
            status=TODO,
            hint="not done yet: run the project's 2-process run and pass (task, record, state)",
        )
    return None


def _unpack(answer):
    if not (isinstance(answer, tuple) and len(answer) in (3, 4)):  # 4: (..., pieces) for a pieces milestone
        raise TypeError(
            f"the answer is the tuple (task, record, state) from run_project / train_on, got {type(answer).__name__}"
        )
    task, record, state = answer[:3]
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

    if not_done(answer):
        return None
    _, record, state = _unpack(answer)
    fields = dict(summary=record.summary, rows=record.rows, evals=record.evals)

    def jsonable(o):  # a NumPy or 0-d torch number as a number; anything else as its repr (which fails the checks)
        return o.item() if getattr(o, "ndim", None) == 0 and hasattr(o, "item") else repr(o)

    return json.loads(json.dumps(fields, default=jsonable)), tensor_state(state), exact_str(type(state).__name__)


def open_answer(answer, grader):
    """(record, tensors, type name) of the answer, read in a worker; None when not answered."""
    from types import SimpleNamespace

    got = grader.ask(_answer_harness, answer, what="your answer")
    return None if got is None else (SimpleNamespace(**got[0]), got[1], got[2])


def run_checks(record, budget, global_batch, world_size=2):
    """World size, consistency and the time budget of the record."""
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


def same_eval(record, key, recomputed, tol, what):
    last = record.evals[-1]["eval"].get(key) if record.evals else None
    ok = isinstance(last, (int, float)) and abs(last - recomputed) <= tol
    return Result(
        f"the record's last evaluation is what these weights score ({what})",
        ok,
        "the weights and the record do not come from the same run (or the record was edited): pass the "
        "record and the state that one train_on / run_project call returned",
        f"recorded {last}, recomputed {recomputed:.5f}",
    )


def standard_plan(name: str, world_size: int = 2):
    """The milestone's plan: the spec's ``plan`` if it declares one, else data parallel on ``world_size`` ranks,
    with the project's own plan defaults."""
    from ..plan import Plan
    from ..projects.registry import get

    fields = (get(name).milestone or {}).get("plan")
    if fields:  # the spec's own plan, e.g. {"tp": 2} where a piece runs only under tensor parallelism
        return Plan(**{**get(name).plan_defaults(dict(fields)), **fields})
    return Plan(dp=world_size, **get(name).plan_defaults({"dp": world_size}))


def _rerun_standard(name, record, grader, world_size):
    """The first steps of the project's standard plan re-run on the grader's workers (:mod:`.rerun`)."""
    from .rerun import check_losses, check_spans, check_time, record_threads, replay, time_ratio

    cfg = standard(name)
    plan = standard_plan(name, world_size)
    device = record.summary.get("device", "cpu")
    replayed = replay(
        grader, cfg["task"], plan, cfg["optim"], cfg["steps"], record.rows, record_threads(record.summary), device
    )
    what = f"the standard {world_size}-process plan ({plan.label})"
    yield check_losses(name, record.rows, replayed, what, device)
    yield check_spans(name, record.rows, replayed, what)
    yield check_time(name, time_ratio(record.rows, replayed), {}, what)


def _replay_weights(task, plan, optim, steps, threads, pieces=None):
    """One rank of the whole run re-run (the course's trainer; of the learner's, only ``pieces`` when a pieces
    milestone grades them): rank 0's final weights and buffers as plain CPU tensors."""
    import torch
    import torch.distributed as dist

    from ..train import train

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        record = train(
            task, plan, steps=steps, optim=optim, log_every=steps, verbose=False, measure_memory=False, pieces=pieces
        )
    finally:
        torch.set_num_threads(before)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return {k: v.detach().cpu().clone() for k, v in record.model.module.state_dict().items()}


def check_run_length(name, record, state, grader, world_size=2, timeout: float = 600.0):
    """The whole recorded run re-run on the grader's workers: its final weights and buffers must be the answer's.

    Catches weights trained longer than the record says (the record of a shorter run passed beside them, its last
    evaluation edited to match) and weights changed after training (BatchNorm statistics recomputed on the held-out
    split)."""
    import dataclasses

    from .evidence import tensor_state
    from .rerun import _cluster_for, call_with_pieces, record_threads

    cfg = standard(name)
    budget = int(cfg["steps"])
    steps = record.summary.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= budget:
        yield Result(
            f"the record's length is within the standard run's {budget} steps",
            False,
            f"the milestone's run is the project's standard run of {budget} steps: run it as it is "
            "(run_project(name, 2)), and pass its own record",
            f"the record says {steps!r} steps",
        )
        return
    plan = standard_plan(name, world_size)
    optim = dataclasses.replace(cfg["optim"], decay_steps=cfg["optim"].decay_steps or budget)
    device = str(record.summary.get("device", "cpu"))
    cluster = _cluster_for(grader, device, plan.world_size)
    args = (cfg["task"], plan, optim, steps, record_threads(record.summary))
    mine = call_with_pieces(grader, cluster, _replay_weights, args, timeout)[0]
    theirs = tensor_state(state) or {}
    rtol = GPU_WEIGHT_RTOL if device.startswith("cuda") else WEIGHT_RTOL
    off = []
    for key, want in mine.items():
        got = theirs.get(key)
        if got is None or got.shape != want.shape:
            off.append(f"{key}: missing or of another shape")
            continue
        want, got = want.double(), got.double()
        err = float((got - want).abs().max()) if want.numel() else 0.0
        if err > rtol * max(1.0, float(want.abs().max()) if want.numel() else 0.0):
            off.append(f"{key}: off by {err:.3g}")
    yield Result(
        f"the weights are what the recorded run makes ({steps} steps of the standard plan re-run here)",
        not off,
        "these weights are not the end of the run the record describes: weights trained for longer than the "
        "record's run (the milestone's budget is that run), or weights changed after training (BatchNorm "
        "statistics recomputed on other data, e.g. the held-out split: the held-out data is for evaluating "
        "only). Pass the record and the state that one run_project call returned",
        "; ".join(off[:3]) + (f" (and {len(off) - 3} more)" if len(off) > 3 else "")
        if off
        else f"{len(mine)} tensors within {rtol:g} (relative)",
    )


def then_rerun(name, checks, record, state, grader, world_size=2):
    """``checks``, then (when every one passed) the re-runs on the grader's workers: the first steps, then the whole
    run. A verdict already failed needs no re-run, and a grading run spends its seconds on answers that could pass."""
    ok = True
    for result in checks:
        ok = ok and result.passed
        yield result
    if not ok:
        return
    for result in _rerun_standard(name, record, grader, world_size):
        ok = ok and result.passed
        yield result
    if ok:
        yield from check_run_length(name, record, state, grader, world_size)


def _metric_checks(name, spec, record, state, got):
    """The generic checks of a declared milestone: the record, the step-0 loss, the metric recomputed here."""
    import torch

    cfg = standard(name)
    std = cfg["task"]
    metric, lower = spec["metric"], spec["lower_is_better"]
    yield from run_checks(record, spec["budget_s"], std.global_batch, spec["world_size"])
    yield check_first_loss(record.rows, std, f"{type(std).__name__} with the project's standard sizes")
    model, fit = load_fixed(std.build_model(), state, type(std.build_model()).__name__, got)
    yield fit
    if model is None:
        return
    model.eval()
    with torch.no_grad():
        value = float(std.evaluate(model)[metric])
    yield same_eval(record, metric, value, 1e-6 + 1e-4 * abs(value), f"{metric} recomputed here")
    target = (cfg.get("target") or {}).get(metric)
    if target is None:
        return
    reached = value <= target if lower else value >= target
    yield Result(
        f"{metric} {'<=' if lower else '>='} {target:g} (the standard run's target, recomputed here)",
        reached,
        detail=f"{value:.5g}",
        hint="train the standard run to its end: the target is its settings()'s; check the loss goes down in "
        "the run record",
    )


def milestone(name: str) -> str:
    """Register the graded exercise ``"<name>_milestone"`` from project ``name``'s declared ``MILESTONE`` (see the
    module's docstring) and return its name: ``grading.check(grading.milestone("diabetes"), answer)``."""
    spec = spec_of(name)
    exercise_name = f"{name}_milestone"

    @exercise(exercise_name)
    def _declared(answer, grader):
        opened = open_answer(answer, grader)
        if opened is None:
            yield not_done(None)
            return
        record, state, got = opened
        checks = _metric_checks(name, spec, record, state, got)
        yield from then_rerun(name, checks, record, state, grader, spec["world_size"])

    return exercise_name
