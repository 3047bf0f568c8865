"""The project's standard run: its sizes and its milestone (``simlib train <name>``, ``run_project``, the grader)."""

from __future__ import annotations

from .task import DiabetesTask as TASK  # its fields are the --task.* flags and the [task] table

# the graded milestone: simlib.grading.milestone("<name>") turns it into the check "<name>_milestone"
MILESTONE = dict(metric="eval_loss", lower_is_better=True, budget_s=60.0, world_size=2)


def settings(quick: bool = False) -> dict:
    """The CPU sizes: task, budget, optimizer, evaluation interval and the target the milestone grades."""
    from simlib.plan import OptimConfig

    steps = 60 if quick else 300
    return dict(
        task=TASK(hidden=16 if quick else 32),
        steps=steps,
        eval_every=steps // 4,
        log_every=10,
        optim=OptimConfig(name="adamw", lr=1e-2, warmup_steps=steps // 20),
        target={"eval_loss": 0.7},  # below predicting the mean (1.0): the model learned something
    )


# A GPU size would be gpu_settings(world_size, facts) -> the dict above plus plan={...} (simlib/projects/gpt/run.py);
# without one, `simlib train <name> --size gpu` runs the full size and says so.
