"""What the projects' milestones rebuild themselves, and how they check a run record against it.

A milestone never runs the learner's model code and never reads the learner's task object. It builds the
project's model with the project's own fixed arguments, loads only the learner's weights (``state_dict``:
tensors, nothing else), builds the evaluation data with its own code, and checks the run record for consistency
with what it can recompute:

- the first logged loss (step 0) equals the project's own freshly built model on the project's own first global
  batch (every rank starts from the same seeded weights, so a run of another task, split, seed or model size
  shows here);
- the last evaluation in the record equals the grader's own evaluation of the weights (so the weights and the
  record come from the same run);
- the plan and world size agree across the fields the trainer wrote (``world_size``, ``plan``, one matmul rate
  per rank), the steps, samples and tokens of every row agree with the global batch, the budget and the
  evaluation interval, and the time to the target is recomputed from the evaluations.

What these checks alone cannot see (each record field is the learner's word) is left to the re-run of the first
steps on the grader's own workers (:mod:`.rerun`: losses, span kinds, step time) and to the held-out traces drawn
at check time (:mod:`.heldout`); each milestone's docstring lists what can still be faked after all of them.
"""

from __future__ import annotations

from .core import Result


def tensor_state(state) -> dict | None:
    """``state`` as {name: tensor}, or None when it is anything else (an object, a module, code)."""
    import torch

    if not isinstance(state, dict) or not state:
        return None
    if not all(isinstance(k, str) and type(v) is torch.Tensor for k, v in state.items()):
        return None
    return {k[len("module.") :] if k.startswith("module.") else k: v.detach().clone() for k, v in state.items()}


def load_fixed(model, state, what: str, got: str | None = None):
    """Load the learner's tensors into the grader's own ``model`` (strict); -> (model or None, Result). ``got``:
    the type name of what the learner passed, when ``state`` is what a worker could make of it (None: nothing)."""
    tensors = tensor_state(state)
    if tensors is None:
        return None, Result(
            f"the weights fit the project's {what}",
            False,
            "pass the trained weights as a state_dict (names -> tensors, as train_on returns them): "
            "the check builds the model itself and loads only the weights",
            f"got {got or type(state).__name__}",
        )
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    shapes = [
        f"{k}: {tuple(tensors[k].shape)} instead of {tuple(own[k].shape)}"
        for k in own
        if k in tensors and tensors[k].shape != own[k].shape
    ]
    if missing or extra or shapes:
        detail = "; ".join(
            x
            for x in (
                f"missing {missing[:3]}" if missing else "",
                f"not in the model {extra[:3]}" if extra else "",
                ", ".join(shapes[:3]),
            )
            if x
        )
        return None, Result(
            f"the weights fit the project's {what}",
            False,
            f"the check builds the project's own {what} with the project's fixed sizes and loads "
            "only your weights: a model of another shape (another width, more inputs, extra "
            "parameters or buffers) is not the project's model. Train the standard task's model",
            detail,
        )
    model.load_state_dict(tensors)
    return model, Result(f"the weights fit the project's {what}", True, detail=f"{len(tensors)} tensors")


def first_loss(task) -> float:
    """The loss of ``task``'s freshly built (seeded) model on its global batch of step 0, in train mode."""
    import torch

    model = task.build_model()
    model.train()
    x, y = task.batch(0)
    with torch.no_grad():
        return float(task.loss(model(x), y))


def check_first_loss(rows, task, what: str) -> Result:
    """The record's step-0 loss against the grader's own: the run trained this project's task from its start."""
    first = next((r for r in rows if r.get("step") == 0), None)
    mine = first_loss(task)
    recorded = first.get("loss") if first else None
    ok = isinstance(recorded, (int, float)) and abs(recorded - mine) <= 1e-4 * abs(mine) + 1e-12
    return Result(
        "the run trained the project's task from its start (step-0 loss recomputed here)",
        ok,
        f"the record's first loss is not the project's freshly built model on the project's first "
        f"global batch ({what}): the run trained other data (another split, seed or calibration "
        "period), another model, or the record was edited. Run the project's standard task",
        f"recorded {recorded}, recomputed {mine:.6f}",
    )


def check_consistent(rows, evals, summary, global_batch, tokens_per_sample=0, eval_every=None, steps=None) -> Result:
    """Rows and evaluations agree with each other, with the global batch and (if given) the budget."""
    problems = []
    for r in list(rows) + list(evals):
        step = r.get("step")
        done = step + 1 if "eval" not in r else step  # a step row counts the step it logs
        if not isinstance(step, int) or r.get("samples") != done * global_batch:
            problems.append(f"step {step}: samples {r.get('samples')} is not {done} x {global_batch}")
        elif tokens_per_sample and r.get("tokens") != r["samples"] * tokens_per_sample:
            problems.append(f"step {step}: tokens {r.get('tokens')} is not samples x {tokens_per_sample}")
    ordered = sorted(list(rows) + list(evals), key=lambda r: (r.get("step") or 0) - 0.5 * ("eval" in r))
    times = [r.get("train_time") for r in ordered]  # an evaluation at step k comes after step k-1's row
    if any(not isinstance(t, (int, float)) for t in times) or any(b < a for a, b in zip(times, times[1:])):
        problems.append("train_time does not grow with the steps")
    if evals and summary.get("train_time") is not None and summary["train_time"] < max(e["train_time"] for e in evals):
        problems.append(
            f"the summary's train_time {summary['train_time']:.1f} s is less than the last "
            f"evaluation's {max(e['train_time'] for e in evals):.1f} s"
        )
    if eval_every:
        last = max((e["step"] for e in evals), default=None)
        off = [e["step"] for e in evals if e["step"] % eval_every and e["step"] != last]
        if off:
            problems.append(f"evaluations at steps {off[:3]}, not every {eval_every}")
    if steps is not None:
        last = max((r.get("step", 0) + 1 for r in rows), default=0)
        if last > steps:
            problems.append(f"{last} steps; the project's budget is {steps}")
    return Result(
        "the run record is consistent (steps, samples, tokens, times, evaluations)",
        not problems,
        "the record's rows do not agree with each other or with the project's budget: rerun the plan "
        "instead of editing its files (the check recomputes what it can from the rows)",
        "; ".join(problems[:3]),
    )


def check_world_size(summary, world_size: int, rows=None) -> Result:
    """Every field the trainer wrote about the processes says ``world_size``."""
    plan = summary.get("plan") if isinstance(summary.get("plan"), dict) else {}
    plan_ws = 1
    for key in ("dp", "tp", "pp"):
        plan_ws *= int(plan.get(key, 1) or 1)
    rates = summary.get("matmul_gflops_per_rank")
    said = {
        "world_size": summary.get("world_size"),
        "plan": plan_ws,
        "ranks that reported": len(rates) if isinstance(rates, list) else None,
    }
    ok = all(v == world_size for v in said.values())
    differ = {k: v for k, v in said.items() if v != world_size}
    return Result(
        f"trained on {world_size} processes (world size, plan and per-rank reports agree)",
        ok,
        f"the milestone is about {world_size} processes: run it with train_on({world_size}, ...) / "
        f"run_project(..., world_size={world_size}) or the 2-process plan"
        + (
            ""
            if len(set(map(str, said.values()))) == 1
            else ". The record's fields disagree on how many processes ran: it was edited"
        ),
        ", ".join(f"{k} {v}" for k, v in (differ or said).items()),
    )
