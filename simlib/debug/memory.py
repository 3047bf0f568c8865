"""The peak memory of a whole training step under a plan, by kind: the one training loop with the
:class:`simlib.parallel.step_memory.StepMemory` hook on its last step.

    outs = cluster.call(step_peak, (GPTTask.quick(), Plan(tp=2, sequence_parallel=True)))   # on every rank
    outs[0]["peak"], outs[0]["at_peak"]["Activation"], outs[0]["peak_in"]
"""

from __future__ import annotations

__all__ = ["step_peak", "train_counting_state", "measured_memory"]


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
    train(
        task,
        plan,
        steps=steps,
        optim=optim or OptimConfig(),
        log_every=0,
        eval_every=0,
        measure_memory=False,
        verbose=False,
        warmup=0,
        step_hook=hook,
    )
    return {**hook.result(), "rank": dist.get_rank() if dist.is_initialized() else 0}


def train_counting_state(task, plan, **kwargs):
    """Call on every rank: :func:`simlib.train.train` (same arguments), with each rank's bytes of parameters,
    optimizer states and gradients as its second step starts beside its step peak, in
    ``record.summary["memory_ranks"]`` (``params``, ``optimizer``, ``grads``, ``step_peak``). The trainer's CPU
    peak (``peak_memory_by_rank``) counts what the step allocates above what was live as it started, net of what
    it frees, which leaves those out — and the step frees the last step's gradients first
    (``zero_grad(set_to_none=True)``), so its peak above the start is that much lower; :func:`measured_memory`
    adds all three. ``simlib.projects.runner.train_on(..., train_fn=train_counting_state)`` runs it."""
    import torch.distributed as dist

    from ..train import train

    box = {}

    def hook(info):
        if info.step == 1:  # the step whose peak the trainer measures; the optimizer's states exist by now
            params = list(info.model.module.parameters())
            box["params"] = sum(p.numel() * p.element_size() for p in params)
            box["optimizer"] = sum(
                v.numel() * v.element_size()
                for st in info.optimizer.state.values()
                for v in st.values()
                if hasattr(v, "element_size")
            )
            grads = {
                p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                for p in params
                if p.grad is not None
            }  # a bucket's views count once
            box["grads"] = sum(grads.values())

    record = train(task, plan, step_hook=hook, **kwargs)
    ranks = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(ranks, box)
    else:
        ranks = [box]
    for r, peak in zip(ranks, record.summary["peak_memory_by_rank"]):
        r["step_peak"] = peak
    record.summary["memory_ranks"] = ranks
    return record


def measured_memory(ranks) -> int | None:
    """The largest rank's parameters + optimizer states + gradients live as the step starts + the step's peak
    above its start (bytes): what the simulator's memory per device predicts. None where a rank has no measured
    peak (not on CPU)."""
    if any(r.get("step_peak") is None for r in ranks):
        return None
    return max(r["params"] + r["optimizer"] + r.get("grads", 0) + r["step_peak"] for r in ranks)
