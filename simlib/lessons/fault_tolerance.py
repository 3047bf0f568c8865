"""Lesson 08's formula: what a checkpoint holds per parameter (the checkpointing itself is ``simlib.checkpoint``).

Training memory and a checkpoint differ by the gradients: a step needs them, a restart does not (they are rebuilt
by the next backward). So a checkpoint holds the weights and the optimizer's states, the training memory of
``simlib.sim.memory.BYTES_PER_PARAM`` without its gradients:

- fp32 AdamW (what lesson 08 saves and times): 4 (weights) + 8 (two moments) = **12** bytes per parameter;
- mixed-precision Adam: 2 (bf16 weights) + 12 (fp32 master weights and two moments) = **14** — or 12 where only
  the fp32 master copy is saved (the bf16 weights are its rounding). Never 16: the 16 of mixed-precision Adam's
  training memory (ZeRO's count) includes 2 bytes of gradients.
"""

from __future__ import annotations

__all__ = ["checkpoint_bytes_per_param"]


def checkpoint_bytes_per_param(mixed_precision: bool = False, optimizer: str = "adam", low_precision_copy: bool = True):
    """Bytes a checkpoint stores per parameter: training memory's weights and optimizer states, no gradients.

    ``low_precision_copy=False`` (mixed precision only): the 16-bit weights are not saved, only the fp32 master."""
    from ..sim.memory import BYTES_PER_PARAM

    key = ("mixed" if mixed_precision else "fp32", optimizer)
    if key not in BYTES_PER_PARAM:
        raise ValueError(f"unknown optimizer {optimizer!r}: one of {sorted({o for _, o in BYTES_PER_PARAM})}")
    weights, _gradients, states = BYTES_PER_PARAM[key]
    if mixed_precision and not low_precision_copy:
        weights = 0
    return weights + states
