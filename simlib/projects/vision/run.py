"""The vision project's standard run (``simlib train vision``, ``notebooks/11_project_vision.ipynb``, the grader)."""

from __future__ import annotations

from .task import DigitsTask as TASK


def settings(quick: bool = False) -> dict:
    """Task, step budget, optimizer and target of the vision project's standard run."""
    from ...plan import OptimConfig

    if quick:
        task, steps, every, target = TASK(global_batch=64, image_size=12, width=8), 100, 20, 0.92
    else:
        task, steps, every, target = TASK(global_batch=128, image_size=16, width=16), 300, 25, 0.97
    optim = OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, warmup_steps=steps // 20)
    return dict(task=task, steps=steps, optim=optim, eval_every=every, target={"accuracy": target})


def plan_defaults(fields: dict) -> dict:
    """BatchNorm statistics over the whole global batch when there are several data-parallel ranks."""
    return {"sync_batchnorm": fields.get("dp", 1) > 1}
