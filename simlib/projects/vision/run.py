"""The vision project's standard run (``simlib train vision``, ``notebooks/11_project_vision.ipynb``, the grader)."""

from __future__ import annotations

from ...pieces import Slot
from .task import DigitsTask as TASK

# The learner's pieces (solutions/11_vision_pieces.ipynb): what they write, where it runs, the course's own fallback
PIECES = {
    "sync_batchnorm": Slot(
        "sync_batchnorm",
        what="BatchNorm's statistics over every rank's samples: forward and backward (all-reduced sums)",
        given="simlib.parallel.batchnorm:SyncBatchNormFunction",
        check="sync_batchnorm",
        interface="torch.autograd.Function; .apply(x, weight, bias, eps, group) -> (y, mean, var, count)",
    ),
    "data_shard": Slot(
        "data_shard",
        what="which training samples each rank reads at a step (the epoch's shuffled order, this rank's part)",
        given="simlib.projects.vision.sampler:data_shard",
        check="data_shard",
        interface="function(step, rank, world_size, global_batch, num_samples, order) -> int64 tensor",
    ),
}

FOLDER_PER_PLAN = True  # results/vision/<plan label>/ by default
MILESTONE = dict(metric="accuracy", lower_is_better=False, budget_s=60.0)  # graded by grading.vision_finance


def settings(quick: bool = False) -> dict:
    """Task, step budget, optimizer and target of the vision project's standard run."""
    from ...plan import OptimConfig

    if quick:
        task, steps, every, target = TASK(global_batch=64, image_size=12, width=8), 100, 20, 0.92
    else:
        task, steps, every, target = TASK(global_batch=128, image_size=16, width=16), 300, 25, 0.97
    optim = OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, warmup_steps=steps // 20)
    return dict(task=task, steps=steps, optim=optim, eval_every=every, target={"accuracy": target})


def gpu_settings(world_size: int = 1, facts: list[dict] | None = None) -> dict:
    """The GPU size: a wider, deeper ResNet on 64x64 digits (~3.6 GFLOP forward per image), 512 images a step,
    augmented on the GPU; bf16 or fp16 by the GPU."""
    from ...plan import OptimConfig
    from .. import gpu

    facts = gpu.gpu_facts() if facts is None else facts
    task = TASK(global_batch=512, image_size=64, width=64, blocks_per_stage=2, augment_on="cuda")
    steps = 1000
    optim = OptimConfig(name="sgd", lr=0.2, momentum=0.9, weight_decay=5e-4, warmup_steps=steps // 20)
    return dict(
        task=task,
        steps=steps,
        optim=optim,
        eval_every=100,
        log_every=25,
        target={"accuracy": 0.98},
        plan=dict(mixed_precision=gpu.precision_for(facts)),
    )


def plan_defaults(fields: dict) -> dict:
    """BatchNorm statistics over the whole global batch when there are several data-parallel ranks."""
    return {"sync_batchnorm": fields.get("dp", 1) > 1}
