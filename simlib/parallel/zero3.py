"""ZeRO stage 3 (FSDP): each block's parameters live as one flat 1/N shard per rank (Rajbhandari et al. 2020, §5.3;
torch's FSDP2 ``fully_shard`` is the maintained reference). Stages 1 and 2 are in ``zero.py``.

Before a block's forward (and again before its backward) its shards are all-gathered into the whole flat
buffer, and freed after; the gradient of the buffer is reduce-scattered back to the shards (mean over the group).
Shards are flat slices across tensors (padded to a multiple of the world size): exact for optimizers that update
element by element (``ELEMENTWISE_OPTIMIZERS``), refused for the others.

Mixed precision as FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``: ``Zero3(..., param_dtype=bf16)``
casts each shard to bf16 *before* the all-gather (half the bytes; the block computes with bf16 weights), and
reduce-scatters the gradient in ``reduce_dtype`` (fp32 by default) into the fp32 shard's gradient: the shards,
their gradients and the optimizer's states stay fp32 (the master weights).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from .recompute import blocks_of
from .zero import ELEMENTWISE_OPTIMIZERS, _count, _global_rank, _group_info, all_gather_shards, reduce_scatter_shards

__all__ = ["Zero3", "check_elementwise", "shard_key"]


def shard_key(p: nn.Parameter) -> tuple:
    """Parameters that share a flat shard: same dtype, and both decayed (matrices) or both not (biases, norms)."""
    return (p.dtype, p.dim() >= 2)


class _Unit:
    """One block's trainable parameters of one ``key`` as a flat buffer: a 1/N shard kept, the whole only in use."""

    def __init__(
        self, name, module, key, group, rank, world_size, comm_counter, param_dtype=None, reduce_dtype=torch.float32
    ):
        self.name, self.module, self.key = name, module, key
        self.reduce_dtype = reduce_dtype
        self.group, self.rank, self.world_size = group, rank, world_size
        self.comm_counter = comm_counter
        self.slots = []  # (submodule, attribute, index of its tensor, qualified name)
        tensors = []
        for mod_name, mod in module.named_modules():
            for attr, p in list(mod._parameters.items()):
                if p is None or not p.requires_grad or shard_key(p) != key:
                    continue  # frozen parameters stay whole on every rank
                index = next((i for i, t in enumerate(tensors) if t is p), None)
                if index is None and getattr(p, "_zero3_claimed", False):
                    raise ValueError(
                        f"rank {rank}: parameter {mod_name}.{attr} is shared with a module of another "
                        "block (tied weights across blocks); this ZeRO-3 keeps a tied tensor in one "
                        "unit. Pass blocks that keep both users together (or leave them to the root)"
                    )
                if index is None:
                    index = len(tensors)
                    tensors.append(p)
                self.slots.append((mod, attr, index, f"{mod_name}.{attr}".lstrip(".")))
        for t in tensors:
            t._zero3_claimed = True
        self.shapes = [tuple(t.shape) for t in tensors]
        if not tensors:
            self.shard = None
            return
        self.numels = [t.numel() for t in tensors]
        total = sum(self.numels)
        self.chunk = math.ceil(total / world_size)  # padded: any parameter count, any world size
        self.padding = self.chunk * world_size - total
        flat = torch.cat([t.detach().reshape(-1) for t in tensors] + [tensors[0].new_zeros(self.padding)])
        # every rank keeps its slice of rank 0's values, so all start equal (as DDP's broadcast does)
        dist.broadcast(flat, src=_global_rank(group, 0), group=group)
        self.shard = nn.Parameter(flat[rank * self.chunk : (rank + 1) * self.chunk].clone())
        mixed = param_dtype is not None and flat.is_floating_point()  # (the policy casts floating shards only)
        self.full = torch.empty(self.chunk * world_size, dtype=param_dtype if mixed else flat.dtype, device=flat.device)
        del flat
        self.free()
        for mod, attr, *_ in self.slots:
            if attr in mod._parameters:
                del mod._parameters[attr]
            setattr(mod, attr, None)

    # the full buffer's storage is resized, not reallocated: autograd's saved views of it stay valid
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def gather(self) -> None:
        if self.gathered():
            return
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        _count(self.comm_counter, "all_gather", self.full)
        all_gather_shards(self.full, self.source(), group=self.group)

    def source(self) -> torch.Tensor:
        """What this rank sends to the all-gather: its shard, cast to the compute dtype first (the policy)."""
        return self.shard.detach().to(self.full.dtype)

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)

    def attach(self) -> None:
        """All-gather, and point the block's parameter attributes at views of the full buffer (with autograd)."""
        full = _GatherParams.apply(self.shard, self)
        pieces = [piece.view(shape) for piece, shape in zip(full.split(self.numels + [self.padding]), self.shapes)]
        for mod, attr, index, _ in self.slots:
            setattr(mod, attr, pieces[index])  # tied attributes get the same view


class _GatherParams(torch.autograd.Function):
    """Forward: all-gather the shards into the full flat buffer. Backward: reduce-scatter its gradient (mean)."""

    @staticmethod
    def forward(ctx, shard, unit):
        unit.gather()
        ctx.unit = unit
        return unit.full.data  # a fresh version counter: refilling the buffer before backward is not an edit

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        unit.free()  # the block's backward is done: its weights can go before the gradient is reduced
        if grad_full.is_floating_point() and grad_full.dtype != unit.shard.dtype:
            grad_full = grad_full.to(unit.reduce_dtype)  # the policy: reduce in fp32, not in the compute dtype
        grad_shard = grad_full.new_empty(unit.chunk)
        _count(unit.comm_counter, "reduce_scatter", grad_full)
        reduce_scatter_shards(grad_shard, grad_full.contiguous(), group=unit.group)
        grad_shard.div_(unit.world_size)
        return grad_shard.to(unit.shard.dtype), None


class Zero3(nn.Module):
    """ZeRO-3 (FSDP): each of ``blocks`` keeps a 1/N flat shard of its parameters; the rest of the model is one
    more unit. A block's parameters exist whole only from just before its forward (or backward) to just after.

    ``model.parameters()`` yields the shards: build any element-wise optimizer over them, as it is, on every rank
    (``torch.optim.AdamW(zero3.parameters(), ...)``): each rank steps its own shard, nothing to broadcast.
    ``full_state_dict()`` gathers the whole model (for evaluation or saving), from the fp32 shards.
    ``param_dtype`` (e.g. ``torch.bfloat16``): the mixed-precision policy (module docstring); None: the shards'.
    """

    def __init__(
        self,
        module: nn.Module,
        blocks=None,
        group=None,
        comm_counter=None,
        param_dtype=None,
        reduce_dtype=torch.float32,
    ):
        super().__init__()
        self.group, self.rank, self.world_size = _group_info(group)
        self.module = module
        blocks = list(blocks) if blocks is not None else blocks_of(module)
        self.comm_counter = comm_counter
        names = {id(m): n for n, m in module.named_modules()}
        units = []
        for b in blocks:  # a block may be a grouping made on the fly (e.g. Sequential(Linear, ReLU)): use its parts
            parts = [b] if id(b) in names else [m for m in b.modules() if id(m) in names and m._parameters]
            if not parts:
                raise ValueError(
                    f"rank {self.rank}: block {type(b).__name__} is not part of the model passed to "
                    "Zero3: pass submodules of it (task.blocks(model) on the same model)"
                )
            units += [m for m in parts if all(m is not u for u in units)]
        blocks = units
        keys = sorted({shard_key(p) for p in module.parameters() if p.requires_grad}, key=str)
        policy = dict(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        self.units = [
            _Unit(names[id(b)], b, k, self.group, self.rank, self.world_size, comm_counter, **policy)
            for b in blocks
            for k in keys
        ]
        self.units += [
            _Unit("", module, k, self.group, self.rank, self.world_size, comm_counter, **policy) for k in keys
        ]
        self.units = [u for u in self.units if u.shard is not None]
        self.shards = nn.ParameterList([u.shard for u in self.units])
        for b in module.buffers():
            dist.broadcast(b.data, src=_global_rank(self.group, 0), group=self.group)
        for unit in self.units:
            unit.module.register_forward_pre_hook(_pre_forward(unit))
            unit.module.register_forward_hook(_post_forward(unit))

    def param_groups(self, weight_decay: float = 0.0, **hyper) -> list[dict]:
        """Optimizer groups over the shards: matrices decay, 1-D parameters (biases, norms) do not."""
        decay = [u.shard for u in self.units if u.key[1]]
        rest = [u.shard for u in self.units if not u.key[1]]
        return [
            g
            for g in (
                dict(params=decay, weight_decay=weight_decay, **hyper),
                dict(params=rest, weight_decay=0.0, **hyper),
            )
            if g["params"]
        ]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def full_state_dict(self) -> dict:
        """The unsharded parameters and buffers, by the original names, on every rank."""
        out = {}
        for unit in self.units:  # the shards' own dtype (fp32 masters), not the policy's compute dtype
            full = unit.shard.new_empty(unit.chunk * unit.world_size)
            _count(unit.comm_counter, "all_gather", full)
            all_gather_shards(full, unit.shard.detach(), group=unit.group)
            pieces = full.split(unit.numels + [unit.padding])
            for _, _, index, name in unit.slots:
                out[f"{unit.name}.{name}".lstrip(".")] = pieces[index].view(unit.shapes[index]).clone()
        for name, t in self.module.state_dict().items():
            out.setdefault(name, t)
        return {k: out[k] for k in sorted(out)}


def _pre_forward(unit):
    def hook(module, args):
        unit.attach()
        dtype = unit.full.dtype
        if dtype != unit.shard.dtype:  # the policy casts the block's floating inputs too (FSDP2's cast_forward_inputs)
            return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    return hook


def _post_forward(unit):
    def hook(module, args, output):
        unit.free()
        if torch.is_grad_enabled():
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for t in outs:  # before the block's backward starts: gather its parameters again
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(_pre_backward(unit))
        return output

    return hook


def _pre_backward(unit):
    def hook(grad):
        unit.gather()
        return grad

    return hook


def check_elementwise(optimizer_cls, rank: int = 0) -> None:
    """ZeRO-3 shards are flat slices across tensors: refuse optimizers that need whole tensors."""
    name = getattr(optimizer_cls, "__name__", type(optimizer_cls).__name__)
    base = getattr(optimizer_cls, "func", optimizer_cls)  # functools.partial
    name = getattr(base, "__name__", name)
    if name not in ELEMENTWISE_OPTIMIZERS:
        raise ValueError(
            f"rank {rank}: ZeRO-3 steps flat shards that cut across tensors, which is exact only for "
            f"element-wise optimizers ({', '.join(ELEMENTWISE_OPTIMIZERS[:6])}, ...); {name} may use "
            "whole-tensor statistics. Use zero_stage=1 or 2 (whole tensors per owner) instead"
        )
