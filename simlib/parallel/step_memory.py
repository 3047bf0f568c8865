"""The peak memory of one whole training step (forward, backward, optimizer step) under a plan, by kind.

Measured with torch's maintained tracker, ``torch.distributed._tools.mem_tracker.MemTracker`` (a
``TorchDispatchMode``): every tensor an op allocates is counted by storage, and the parameters, gradients and
optimizer states are labelled as such (``track_external``), so the peak comes with what made it up —
``Parameter``, ``Gradient``, ``Optstate``, ``Activation`` (forward outputs kept for the backward), ``Temp``
(gradients of activations and other backward transients), ``Other`` (the batch). On CPU it is exact and, with
no temporary left in Gloo's hands near the peak (:func:`step_peak`), the same every run.

:func:`sequence_parallel_saving` is the formula the measurement is held to: what plain tensor parallelism keeps
whole outside its split layers and Megatron's sequence parallelism keeps 1/t of (Korthikanti et al. 2022, §4.2.2).
"""
from __future__ import annotations

__all__ = ["step_peak", "sequence_parallel_outside", "sequence_parallel_saving"]


def sequence_parallel_outside(task) -> int:
    """Activation bytes (fp32) that plain TP keeps replicated outside its split layers, for the GPT task's whole
    global batch: per block the two LayerNorm inputs and the inputs of QKV and fc1 (4·s·b·h values), the final
    LayerNorm's input and output (2·s·b·h), and each LayerNorm's mean and 1/std (2·s·b). Korthikanti et al.'s
    "10·sbh" (fp16 bytes) counts dropout masks too; this GPT has none. The simulator's
    ``simlib.sim.memory.activation_bytes_per_layer`` keeps the same 4·s·b·h per layer (its ``replicated`` term)."""
    b, s, h, layers = task.global_batch, task.seq_len, task.hidden, task.num_layers
    return (4 * layers + 2) * b * s * h * 4 + (2 * layers + 1) * 2 * b * s * 4


def sequence_parallel_saving(task, tp: int) -> int:
    """What sequence parallelism saves per rank: the replicated activations, of which each rank keeps 1/tp."""
    return sequence_parallel_outside(task) * (tp - 1) // tp


def step_peak(task, plan, steps: int = 2, optim=None) -> dict:
    """Call on every rank: train ``task`` under ``plan`` for ``steps`` steps as :func:`simlib.train.train` does
    (``zero_grad(set_to_none=True)``, ``forward_backward``, the optimizer's and the scheduler's step), the last one
    under ``MemTracker``. The earlier steps are warm-up: the optimizer's states exist before the measured step, as
    in every step of a run but the first. Returns this rank's ``peak`` (total bytes), ``at_peak`` (the bytes of
    each kind at that moment), ``peak_in`` (``"forward and backward"`` or ``"optimizer step"``) with
    ``peak_forward_backward`` (the peak up to the end of the backward), ``before`` (each kind as the step starts),
    the step's ``loss``, ``params`` and ``param_tensors`` (this rank's parameter count, and of tensors).

    Gloo's worker thread holds each collective's tensors until it drops its work, and to free a tensor whose Python
    object the main thread already let go it needs the GIL, which can come many ops later: a temporary handed to a
    collective just before the peak may then count in it. Seen: SP's logits gather took a contiguous copy of its
    input (1 MB on the quick GPT), and that copy was still alive at the loss in 8 of 60 runs under load (4 of 60
    with a 1 µs GIL switch interval); the gather now runs in place (``CommLog.all_gather``) and 0 of 60 differed."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from .. import env
    from ..parallelize import build_optimizer, parallelize
    from ..train import OptimConfig

    if steps < 2:
        raise ValueError(f"step_peak needs steps >= 2 (one warm-up step creates the optimizer's states), got {steps}")
    ctx = env.init()
    plan.validate(ctx.world_size, task)
    groups = plan.mesh.build()
    pm = parallelize(task.build_model().to(ctx.device), groups, plan, task, ctx.device)
    optimizer, scheduler = build_optimizer(pm, plan, optim or OptimConfig(), steps)

    def one_step(x, y, tracker=None):
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward(x, y)
        if tracker is not None:  # the peak so far: that of the forward and backward (with the loss)
            box["forward_backward"] = int(tracker.get_tracker_snapshot("peak")[ctx.device]["Total"])
        optimizer.step()
        scheduler.step()
        return loss

    box = {}
    for step in range(steps):
        x, y = pm.shard(*task.batch(step))
        if step < steps - 1:
            one_step(x, y)
            continue
        tracker = MemTracker()
        tracker.track_external(pm.module, optimizer, x, y)
        before = tracker.get_tracker_snapshot("current").get(ctx.device, {})
        with tracker:
            loss = one_step(x, y, tracker)
        at_peak = tracker.get_tracker_snapshot("peak")[ctx.device]

    def by_kind(snapshot):  # MemTracker's keys are enum members: their names ("Activation", ...) travel better
        return {getattr(k, "value", k): int(v) for k, v in snapshot.items() if k != "Total"}
    peak = int(at_peak["Total"])
    return dict(peak=peak, at_peak=by_kind(at_peak), before=by_kind(before),
                peak_in="optimizer step" if peak > box["forward_backward"] else "forward and backward",
                peak_forward_backward=box["forward_backward"], loss=float(loss) if loss is not None else None,
                rank=ctx.rank, params=sum(p.numel() for p in pm.module.parameters()),
                param_tensors=len(list(pm.module.parameters())))
