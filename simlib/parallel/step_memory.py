"""The peak memory of one whole training step (forward, backward, optimizer step) under a plan, by kind.

Measured with torch's maintained tracker, ``torch.distributed._tools.mem_tracker.MemTracker`` (a
``TorchDispatchMode``): every tensor an op allocates is counted by storage, and the parameters, gradients and
optimizer states are labelled as such (``track_external``), so the peak comes with what made it up —
``Parameter``, ``Gradient``, ``Optstate``, ``Activation`` (forward outputs kept for the backward), ``Temp``
(gradients of activations and other backward transients), ``Other`` (the batch). On CPU it is exact and, with
no temporary left in Gloo's hands near the peak (:class:`StepMemory`), the same every run. :class:`StepMemory` is a
step hook of the one training loop (``train(..., step_hook=...)``); :func:`simlib.debug.memory.step_peak` runs it.

:func:`sequence_parallel_saving` is the formula the measurement is held to: what plain tensor parallelism keeps
whole outside its split layers and Megatron's sequence parallelism keeps 1/t of (Korthikanti et al. 2022, §4.2.2).
"""

from __future__ import annotations

from contextlib import contextmanager

__all__ = ["StepMemory", "sequence_parallel_outside", "sequence_parallel_saving"]


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


class StepMemory:
    """A step hook for :func:`simlib.train.train` (``step_hook=StepMemory(at=1)``): step ``at`` runs under
    ``MemTracker``, with the model's parameters, the optimizer's states and the batch labelled as such. Earlier
    steps are warm-up: the optimizer's states exist before the measured step, as in every step of a run but the
    first. After the run, :meth:`result` is this rank's ``peak`` (total bytes), ``at_peak`` (the bytes of each kind
    at that moment), ``peak_in`` (``"forward and backward"`` or ``"optimizer step"``) with
    ``peak_forward_backward`` (the peak up to the end of the backward), ``before`` (each kind as the step starts),
    ``params`` and ``param_tensors`` (this rank's parameter count, and of tensors).

    Gloo's worker thread holds each collective's tensors until it drops its work, and to free a tensor whose Python
    object the main thread already let go it needs the GIL, which can come many ops later: a temporary handed to a
    collective just before the peak may then count in it. Seen: SP's logits gather took a contiguous copy of its
    input (1 MB on the quick GPT), and that copy was still alive at the loss in 8 of 60 runs under load (4 of 60
    with a 1 µs GIL switch interval); the gather now runs in place (``CommLog.all_gather``) and 0 of 60 differed."""

    def __init__(self, at: int = 1):
        if at < 1:
            raise ValueError(f"StepMemory needs at >= 1 (one warm-up step creates the optimizer's states), got {at}")
        self.at, self._out = at, None

    def __call__(self, info):
        if info.step != self.at:
            return None
        return self._measure(info)

    @contextmanager
    def _measure(self, info):
        from torch.distributed._tools.mem_tracker import MemTracker

        device = next(info.model.module.parameters()).device
        tracker = MemTracker()
        tracker.track_external(info.model.module, info.optimizer, info.x, info.y)
        before = tracker.get_tracker_snapshot("current").get(device, {})
        box = {}
        # the peak so far, once the backward is done: that of the forward and backward (with the loss)
        info.after_backward.append(lambda: box.update(fb=int(tracker.get_tracker_snapshot("peak")[device]["Total"])))
        with tracker:
            yield
        at_peak = tracker.get_tracker_snapshot("peak")[device]
        peak = int(at_peak["Total"])
        params = list(info.model.module.parameters())
        self._out = dict(
            peak=peak,
            at_peak=_by_kind(at_peak),
            before=_by_kind(before),
            peak_in="optimizer step" if peak > box["fb"] else "forward and backward",
            peak_forward_backward=box["fb"],
            params=sum(p.numel() for p in params),
            param_tensors=len(params),
        )

    def result(self) -> dict:
        if self._out is None:
            raise RuntimeError(f"step {self.at} was never run: train at least {self.at + 1} steps")
        return dict(self._out)


def _by_kind(snapshot) -> dict:  # MemTracker's keys are enum members: their names ("Activation", ...) travel better
    return {getattr(k, "value", k): int(v) for k, v in snapshot.items() if k != "Total"}
