"""The finance project's standard run (``simlib train finance``, ``notebooks/12_project_finance.ipynb``, the
grader): beat the Black-Scholes delta's held-out loss."""

from __future__ import annotations

from ...pieces import Slot
from .task import HedgingTask as TASK

PIECES = {  # the learner's code at these slots trains the model (solutions/12_finance_pieces.ipynb)
    "paths": Slot(
        "paths",
        what="this rank's Monte-Carlo paths for a step: its share of the blocks, each from its own (seed, step, "
        "block) stream",
        given="simlib.projects.finance.pieces:rank_paths",
        check="finance_paths",
        interface="function(task, step, rank, world) -> tensor (paths of this rank, task.days + 1)",
    ),
    "grad_average": Slot(
        "grad_average",
        what="the gradients (and the logged loss) averaged over the ranks, weighted by each rank's number of paths",
        given="simlib.projects.finance.pieces:average_by_count",
        check="finance_grad_average",
        interface="function(params, loss, count, group=None) -> the global mean loss; averages p.grad in place",
    ),
}

FOLDER_PER_PLAN = True  # results/finance/<plan label>/ by default
MILESTONE = dict(metric="eval_loss", budget_s=60.0)  # graded by grading.vision_finance (paths drawn at check time)


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


def gpu_settings(world_size: int = 1, facts: list[dict] | None = None) -> dict:
    """The GPU size: 131,072 Monte-Carlo paths per step (256x the CPU size), drawn on the GPU, through a wider,
    deeper hedging network; fp32 (a 64-wide MLP is launch-bound: low precision buys nothing there)."""
    from ...plan import OptimConfig

    steps = 400
    task = TASK(global_batch=131072, block=4096, hidden=64, depth=3, paths_on="cuda")
    bs = task.evaluate_baseline()
    return dict(
        task=task,
        steps=steps,
        optim=OptimConfig(name="adamw", lr=3e-3, warmup_steps=steps // 20),
        eval_every=50,
        log_every=25,
        target={"eval_loss": bs["bs_rmse_sim"] ** 2},
        plan={},
    )
