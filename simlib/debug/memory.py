"""The peak memory of a whole training step under a plan, by kind: the one training loop with the
:class:`simlib.parallel.step_memory.StepMemory` hook on its last step.

    outs = cluster.call(step_peak, (GPTTask.quick(), Plan(tp=2, sequence_parallel=True)))   # on every rank
    outs[0]["peak"], outs[0]["at_peak"]["Activation"], outs[0]["peak_in"]
"""
from __future__ import annotations

__all__ = ["step_peak"]


def step_peak(task, plan, steps: int = 2, optim=None) -> dict:
    """Call on every rank: train ``task`` under ``plan`` for ``steps`` steps with :func:`simlib.train.train` (no
    evaluation, no log rows, no profiling of its own), the last one under ``MemTracker``. Returns this rank's
    :meth:`StepMemory.result` and its ``rank``."""
    import torch.distributed as dist

    from ..parallel.step_memory import StepMemory
    from ..train import OptimConfig, train
    if steps < 2:
        raise ValueError(f"step_peak needs steps >= 2 (one warm-up step creates the optimizer's states), got {steps}")
    hook = StepMemory(at=steps - 1)
    train(task, plan, steps=steps, optim=optim or OptimConfig(), log_every=0, eval_every=0, measure_memory=False,
          verbose=False, warmup=0, step_hook=hook)
    return {**hook.result(), "rank": dist.get_rank() if dist.is_initialized() else 0}
