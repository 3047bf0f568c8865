"""Activation recomputation: keep a block's input, drop what it saves for backward, recompute it in backward.

``torch.utils.checkpoint.checkpoint`` (non-reentrant) runs the block once without keeping its intermediate
tensors and runs its forward again when backward reaches it: one extra forward of the block (about a third
more compute for a full model) for the memory of its activations (Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost"; Korthikanti et al. 2022 for transformers). The block's own forward is wrapped, so
module hooks (ZeRO-3's gather and free) stay outside the recomputed region and parameter names do not change.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpoint_blocks", "uncheckpoint", "is_checkpointed", "blocks_of"]


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model: ``model.blocks``/``layers``/``net``/``h`` children that hold parameters."""
    for attr in ("blocks", "layers", "net", "h"):
        container = getattr(model, attr, None)
        if isinstance(container, (nn.ModuleList, nn.Sequential)):
            return [m for m in container if any(True for _ in m.parameters())]
    return [m for m in model.children() if any(True for _ in m.parameters())]


def checkpoint_blocks(blocks, which=None) -> list[nn.Module]:
    """Recompute the activations of ``blocks`` (all, or the indices in ``which``) in backward; returns them."""
    blocks = list(blocks)
    which = range(len(blocks)) if which is None else which
    chosen = []
    for i in which:
        if not 0 <= i < len(blocks):
            raise ValueError(f"block index {i} out of range: the model has {len(blocks)} blocks (0..{len(blocks) - 1})")
        block = blocks[i]
        if is_checkpointed(block):
            continue
        original = block.forward

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        forward._simlib_original = original
        block.forward = forward
        chosen.append(block)
    return chosen


def is_checkpointed(block: nn.Module) -> bool:
    return hasattr(block.__dict__.get("forward"), "_simlib_original")


def uncheckpoint(blocks) -> None:
    for block in blocks:
        if is_checkpointed(block):
            block.forward = block.__dict__["forward"]._simlib_original
