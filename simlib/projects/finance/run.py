"""The finance project's standard run (``simlib train finance``, ``notebooks/12_project_finance.ipynb``, the
grader): beat the Black-Scholes delta's held-out loss."""

from __future__ import annotations

from .task import HedgingTask as TASK


def settings(quick: bool = False) -> dict:
    """Task, budget, optimizer and target (the Black-Scholes delta's held-out loss) of the finance run."""
    from ...plan import OptimConfig

    if quick:
        task, steps, every = TASK(global_batch=256, days=20, hidden=16), 120, 30
    else:
        task, steps, every = TASK(global_batch=512), 400, 50
    bs = task.evaluate_baseline()
    return dict(
        task=task,
        steps=steps,
        optim=OptimConfig(name="adamw", lr=3e-3, warmup_steps=steps // 20),
        eval_every=every,
        target={"eval_loss": bs["bs_rmse_sim"] ** 2},
    )
