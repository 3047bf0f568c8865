"""ZeRO stages 1, 2 and 3, built from collectives (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", §5; torch's FSDP2 ``fully_shard`` is the maintained reference).

Plain data parallelism keeps everything on every rank: weights, gradients, optimizer states. ZeRO removes the
copies stage by stage, each rank keeping only the part it *owns*:

    stage 1  ShardedOptimizer       optimizer states of owned parameters only; each rank steps what it owns,
                                    then every parameter is broadcast from its owner
    stage 2  ZeroDataParallel(2)    + each gradient is reduced to its owner during backward and freed elsewhere
    stage 3  Zero3                  + weights: each block's parameters live as one flat 1/N shard per rank,
                                    all-gathered before the block's forward and again before its backward,
                                    freed after each; gradients reduce-scattered back to the shards

Stages 1 and 2 give whole tensors to owners (greedy by size), so any ``torch.optim`` optimizer works unchanged and
parameter counts never need to divide the world size. Stage 3 shards flat buffers (padded to a multiple of the
world size), which is exact for optimizers that update element by element (SGD, Adam, AdamW, ...); others are
refused with a clear error. Gradients are averaged over the data-parallel group, as DDP does.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from .recompute import blocks_of

__all__ = ["partition", "ShardedOptimizer", "ZeroDataParallel", "Zero3", "ELEMENTWISE_OPTIMIZERS",
           "clip_grad_norm_", "CommCounter", "state_bytes"]

# optimizers whose update of an element depends only on that element's gradient and state: exact on flat shards
ELEMENTWISE_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "RMSprop",
                          "ASGD", "Rprop", "MasterWeightsOptimizer")


# torch 2.13 renamed the tensor-in/tensor-out collectives; older torch (>= 2.4) has the first names only
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _group_info(group):
    group = group or dist.group.WORLD
    return group, dist.get_rank(group), dist.get_world_size(group)


def _global_rank(group, rank):
    return dist.get_global_rank(group, rank) if group is not dist.group.WORLD else rank


def partition(numels, world_size: int) -> list[int]:
    """Owner rank of each tensor: largest first, each to the least-loaded rank (ties: lowest rank).

    Deterministic, so every rank computes the same answer without communicating.
    """
    load = [0] * world_size
    owner = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += numels[i]
    return owner


class CommCounter:
    """Counts the bytes this rank hands to each collective (``counter.bytes[kind]``), for the volume check."""

    def __init__(self):
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def add(self, kind: str, tensor: torch.Tensor) -> None:
        self.bytes[kind] = self.bytes.get(kind, 0) + tensor.numel() * tensor.element_size()
        self.calls[kind] = self.calls.get(kind, 0) + 1

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()


def _count(counter, kind, tensor):
    if counter is not None:
        counter.add(kind, tensor)


# ---------------------------------------------------------------- stage 1: the sharded optimizer

class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``optimizer_cls`` over this rank's share of the parameters; the rest are broadcast by their owners.

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)`` — call it on every rank with the same
    parameters, after the gradients are averaged (DDP, simlib's wrappers, or :class:`ZeroDataParallel`).
    Parameter groups, learning-rate schedulers (they write ``param_groups``) and ``zero_grad`` work as usual.
    """

    def __init__(self, params, optimizer_cls, group=None, comm_counter=None, **kwargs):
        self.group, self.rank, self.world_size = _group_info(group)
        self.optimizer_cls = optimizer_cls
        self.comm_counter = comm_counter
        self.local = None  # the optimizer over owned parameters (None if this rank owns nothing)
        self.owner: dict[nn.Parameter, int] = {}
        self.before_step: list = []  # ZeroDataParallel's finish_gradient_synchronization
        super().__init__(params, kwargs)
        self._assign()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (e.g. a layer unfrozen mid-training) on every rank. The parameters already here keep their
        owner and their state (Adam's moments and step counts); the new ones go to the least-loaded ranks."""
        super().add_param_group(param_group)
        if self.local is not None or self.owner:  # a group added after construction: owners of the rest stay
            self._assign(keep=True)

    def _assign(self, keep: bool = False) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        if len(set(map(id, params))) != len(params):
            raise ValueError(f"rank {self.rank}: a parameter appears twice in the optimizer's groups")
        old_owner, old_local = (self.owner, self.local) if keep else ({}, None)
        if old_owner:
            load = [0] * self.world_size
            for p, r in old_owner.items():
                load[r] += p.numel()
            new = [p for p in params if p not in old_owner]
            extra = {}
            for p in sorted(new, key=lambda p: -p.numel()):  # largest first, to the least-loaded rank
                r = min(range(self.world_size), key=lambda r: (load[r], r))
                extra[p] = r
                load[r] += p.numel()
            owners = [old_owner.get(p, extra.get(p)) for p in params]
        else:
            owners = partition([p.numel() for p in params], self.world_size)
        self.owner = {p: r for p, r in zip(params, owners)}
        groups = []
        for g in self.param_groups:
            mine = [p for p in g["params"] if self.owner[p] == self.rank]
            if mine:
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mine})
        self.local = self.optimizer_cls(groups) if groups else None
        if old_local is not None and self.local is not None:  # the moments and step counts carry over
            for p, st in old_local.state.items():
                self.local.state[p] = st
        self._local_groups = [g for g in self.param_groups
                              if any(self.owner[p] == self.rank for p in g["params"])]
        # one flat broadcast per (owner, dtype, device): few messages, whole tensors
        self._buckets: dict[tuple, list[nn.Parameter]] = {}
        for p in params:
            self._buckets.setdefault((self.owner[p], p.dtype, p.device), []).append(p)

    @property
    def owned_parameters(self) -> list[nn.Parameter]:
        return [p for p, r in self.owner.items() if r == self.rank]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for fn in self.before_step:
            fn()
        if self.local is not None:
            self._sync_hyperparameters()
            self.local.step()
        self.synchronize_parameters()
        return loss

    @torch.no_grad()
    def synchronize_parameters(self) -> None:
        """Every parameter from its owner to every rank (the all-gather of ZeRO, as one broadcast per owner)."""
        for (owner, _, _), params in self._buckets.items():
            flat = torch.cat([p.detach().reshape(-1) for p in params]) if self.rank == owner else \
                torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
            _count(self.comm_counter, "broadcast", flat)
            dist.broadcast(flat, src=_global_rank(self.group, owner), group=self.group)
            if self.rank != owner:
                offset = 0
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)

    def _sync_hyperparameters(self) -> None:
        """The inner optimizer's groups take the outer ones' settings (schedulers write ``param_groups``)."""
        for glob, loc in zip(self._local_groups, self.local.param_groups):
            loc.update({k: v for k, v in glob.items() if k != "params"})

    def state_dict(self):
        """This rank's shard of the state (owned parameters only), tagged with rank and world size."""
        if self.local is not None:
            self._sync_hyperparameters()  # a fresh one's inner groups then hold what a saved one holds (initial_lr)
        return {"rank": self.rank, "world_size": self.world_size,
                "local": self.local.state_dict() if self.local is not None else None,
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, state_dict) -> None:
        if state_dict.get("world_size") != self.world_size or state_dict.get("rank") != self.rank:
            raise ValueError(f"rank {self.rank}: this optimizer state was saved by rank {state_dict.get('rank')} of "
                             f"{state_dict.get('world_size')}; a ZeRO-1 shard loads only on the same rank and world "
                             "size (save through torch.distributed.checkpoint to re-shard)")
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        if self.local is not None:
            self.local.load_state_dict(state_dict["local"])

    def __repr__(self) -> str:
        mine = sum(p.numel() for p in self.owned_parameters)
        total = sum(p.numel() for p in self.owner)
        return (f"ShardedOptimizer({self.optimizer_cls.__name__}, rank {self.rank}/{self.world_size} owns "
                f"{mine:,} of {total:,} parameters)")


# ---------------------------------------------------------------- stages 1-2: gradients to their owners

class ZeroDataParallel(nn.Module):
    """Data parallelism for ZeRO-1/2: each gradient is reduced (summed, then divided) onto its owner only.

    ``stage=2`` frees the gradient on every other rank as soon as it is sent, so a rank holds only the
    gradients it owns; ``stage=1`` keeps them (zeros' worth of memory for the same communication). Ownership
    comes from ``optimizer.owner`` (a :class:`ShardedOptimizer` over the same parameters), so the reduce goes
    where the update happens. A reduce to each owner is one reduce-scatter cut along tensor boundaries.
    """

    def __init__(self, module: nn.Module, optimizer: ShardedOptimizer | None = None, stage: int = 2, group=None,
                 comm_counter=None):
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(f"ZeroDataParallel implements stages 1 and 2, got {stage!r} (stage 3: Zero3)")
        self.module, self.stage = module, stage
        self.group, self.rank, self.world_size = _group_info(group)
        self.comm_counter = comm_counter
        self.require_backward_grad_sync = True
        self.optimizer = None
        self._to_average: set = set()
        for p in list(module.parameters()) + list(module.buffers()):  # every replica starts equal
            dist.broadcast(p.data, src=_global_rank(self.group, 0), group=self.group)
        self._handles = [p.register_post_accumulate_grad_hook(self._reduce) for p in module.parameters()
                         if p.requires_grad]
        if optimizer is not None:
            self.attach(optimizer)

    def attach(self, optimizer: ShardedOptimizer) -> None:
        """Reduce each gradient to the rank that ``optimizer`` (a ShardedOptimizer) says owns it."""
        if not isinstance(optimizer, ShardedOptimizer):
            raise TypeError("ZeroDataParallel needs the ShardedOptimizer over the same parameters (it decides "
                            f"which rank owns each gradient), got {type(optimizer).__name__}")
        missing = [n for n, p in self.module.named_parameters() if p.requires_grad and p not in optimizer.owner]
        if missing:
            raise ValueError(f"rank {self.rank}: parameters {missing[:3]} need gradients but are not in the "
                             "ShardedOptimizer: build it over model.parameters() (frozen ones may be left out)")
        self.optimizer = optimizer
        optimizer.before_step.append(self.finish_gradient_synchronization)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate local gradients without communicating (every rank keeps its full gradients meanwhile)."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @torch.no_grad()
    def _reduce(self, p: nn.Parameter) -> None:
        if not self.require_backward_grad_sync:
            return
        if self.optimizer is None:
            raise RuntimeError(f"rank {self.rank}: ZeroDataParallel has no optimizer yet: pass the ShardedOptimizer "
                               "(or call .attach(optimizer)) before the first backward")
        owner = self.optimizer.owner[p]
        _count(self.comm_counter, "reduce", p.grad)
        dist.reduce(p.grad, dst=_global_rank(self.group, owner), group=self.group)
        if self.rank == owner:
            self._to_average.add(p)  # a running SUM over ranks (and micro-batches), divided once in finish
        elif self.stage == 2:
            p.grad = None  # the memory ZeRO-2 saves: only owners keep gradients
        else:
            p.grad.zero_()  # ZeRO-1 keeps the buffer; zeroed, so the next micro-batch sends only what is new

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Divide the owned, reduced gradients by the world size (the mean). ``optimizer.step()`` calls it too."""
        for p in self._to_average:
            p.grad.div_(self.world_size)
        self._to_average.clear()


def clip_grad_norm_(parameters, max_norm: float, group=None) -> torch.Tensor:
    """Clip by the global gradient norm when each rank holds only some gradients (ZeRO-2/3).

    ``torch.nn.utils.clip_grad_norm_`` sees only this rank's gradients: with sharded gradients its norm is
    wrong. Here each rank sums the squares it owns, one all-reduce makes the global norm. Pass the parameters
    whose gradients this rank owns (ZeRO-2: ``optimizer.owned_parameters``; ZeRO-3: ``model.parameters()``).
    """
    group = group or dist.group.WORLD
    grads = [p.grad for p in parameters if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        sq += g.detach().double().pow(2).sum()
    dist.all_reduce(sq, group=group)
    norm = sq.sqrt()
    scale = max_norm / (float(norm) + 1e-6)
    if scale < 1:
        for g in grads:
            g.mul_(scale)
    return norm.float()


# ---------------------------------------------------------------- stage 3: sharded parameters per block

def shard_key(p: nn.Parameter) -> tuple:
    """Parameters that share a flat shard: same dtype, and both decayed (matrices) or both not (biases, norms)."""
    return (p.dtype, p.dim() >= 2)


class _Unit:
    """One block's trainable parameters of one ``key`` as a flat buffer: a 1/N shard kept, the whole only in use."""

    def __init__(self, name, module, key, group, rank, world_size, comm_counter):
        self.name, self.module, self.key = name, module, key
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
                    raise ValueError(f"rank {rank}: parameter {mod_name}.{attr} is shared with a module of another "
                                     "block (tied weights across blocks); this ZeRO-3 keeps a tied tensor in one "
                                     "unit. Pass blocks that keep both users together (or leave them to the root)")
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
        self.shard = nn.Parameter(flat[rank * self.chunk:(rank + 1) * self.chunk].clone())
        self.full = torch.empty(self.chunk * world_size, dtype=flat.dtype, device=flat.device)
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
        _all_gather(self.full, self.shard.detach(), group=self.group)

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
        grad_shard = torch.empty_like(unit.shard)
        _count(unit.comm_counter, "reduce_scatter", grad_full)
        _reduce_scatter(grad_shard, grad_full.contiguous(), group=unit.group)
        grad_shard.div_(unit.world_size)
        return grad_shard, None


class Zero3(nn.Module):
    """ZeRO-3 (FSDP): each of ``blocks`` keeps a 1/N flat shard of its parameters; the rest of the model is one
    more unit. A block's parameters exist whole only from just before its forward (or backward) to just after.

    ``model.parameters()`` yields the shards: build any element-wise optimizer over them, as it is, on every rank
    (``torch.optim.AdamW(zero3.parameters(), ...)``): each rank steps its own shard, nothing to broadcast.
    ``full_state_dict()`` gathers the whole model (for evaluation or saving).
    """

    def __init__(self, module: nn.Module, blocks=None, group=None, comm_counter=None):
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
                raise ValueError(f"rank {self.rank}: block {type(b).__name__} is not part of the model passed to "
                                 "Zero3: pass submodules of it (task.blocks(model) on the same model)")
            units += [m for m in parts if all(m is not u for u in units)]
        blocks = units
        keys = sorted({shard_key(p) for p in module.parameters() if p.requires_grad}, key=str)
        self.units = [_Unit(names[id(b)], b, k, self.group, self.rank, self.world_size, comm_counter)
                      for b in blocks for k in keys]
        self.units += [_Unit("", module, k, self.group, self.rank, self.world_size, comm_counter) for k in keys]
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
        return [g for g in (dict(params=decay, weight_decay=weight_decay, **hyper),
                            dict(params=rest, weight_decay=0.0, **hyper)) if g["params"]]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def full_state_dict(self) -> dict:
        """The unsharded parameters and buffers, by the original names, on every rank."""
        out = {}
        for unit in self.units:
            unit.gather()
            pieces = unit.full.split(unit.numels + [unit.padding])
            for _, _, index, name in unit.slots:
                out[f"{unit.name}.{name}".lstrip(".")] = pieces[index].view(unit.shapes[index]).clone()
            unit.free()
        for name, t in self.module.state_dict().items():
            out.setdefault(name, t)
        return {k: out[k] for k in sorted(out)}


def _pre_forward(unit):
    def hook(module, args):
        unit.attach()
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
        raise ValueError(f"rank {rank}: ZeRO-3 steps flat shards that cut across tensors, which is exact only for "
                         f"element-wise optimizers ({', '.join(ELEMENTWISE_OPTIMIZERS[:6])}, ...); {name} may use "
                         "whole-tensor statistics. Use zero_stage=1 or 2 (whole tensors per owner) instead")


def state_bytes(model: nn.Module, optimizer=None) -> dict:
    """Bytes this rank holds now for weights, gradients and optimizer states (each storage counted once)."""
    seen: set = set()

    def size(t):
        if t is None or not isinstance(t, torch.Tensor):
            return 0
        if hasattr(t, "to_local"):  # a DTensor (FSDP2): this rank's shard
            t = t.to_local()
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in seen or s.nbytes() == 0:
            return 0
        seen.add(key)
        return s.nbytes()

    params = list(model.parameters())
    weights = sum(size(p) for p in params)
    grads = sum(size(p.grad) for p in params)
    opt = 0
    for o in _inner_optimizers(optimizer):
        for st in o.state.values():
            opt += sum(size(v) for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        opt += sum(size(m) for m in getattr(o, "masters", []))
        opt += sum(size(m.grad) for m in getattr(o, "masters", []))
    return dict(weights=weights, gradients=grads, optimizer=opt)


def _inner_optimizers(optimizer):
    while optimizer is not None:
        yield optimizer
        optimizer = getattr(optimizer, "local", None) or getattr(optimizer, "inner", None)


# ---------------------------------------------------------------- the training loop's entry points (simlib.train)

def parallelize(model: nn.Module, groups, plan, task=None, timeline=None) -> nn.Module:
    """The DP wrapper for ``plan.zero_stage`` over the data-parallel group (called by simlib.parallelize)."""
    rank = dist.get_rank()
    if plan.tp > 1 or plan.pp > 1:
        raise ValueError(f"rank {rank}: zero_stage={plan.zero_stage} with tp={plan.tp}, pp={plan.pp} is not built "
                         "here: ZeRO shards over data parallelism only. Use tp = pp = 1, or zero_stage=0")
    if plan.zero_stage in (1, 2):
        return ZeroDataParallel(model, stage=plan.zero_stage, group=groups.dp_group)
    blocks = task.blocks(model) if task is not None and hasattr(task, "blocks") else None
    return Zero3(model, blocks=blocks, group=groups.dp_group)


def build_optimizer(pm, plan, optim, param_groups) -> torch.optim.Optimizer:
    """ZeRO-1/2: a ShardedOptimizer over the trainer's groups; ZeRO-3: the optimizer over this rank's shards."""
    if optim.name == "adamw":
        cls, hyper = torch.optim.AdamW, dict(lr=optim.lr, betas=optim.betas)
    else:
        cls, hyper = torch.optim.SGD, dict(lr=optim.lr, momentum=optim.momentum)
    if plan.zero_stage in (1, 2):
        optimizer = ShardedOptimizer([g for g in param_groups if g["params"]], cls, group=pm.groups.dp_group,
                                     **hyper)
        pm.wrapped.attach(optimizer)
        return optimizer
    check_elementwise(cls, dist.get_rank())
    return cls(pm.wrapped.param_groups(weight_decay=optim.weight_decay), **hyper)


def clip_grad_norm(pm, max_norm: float) -> float:
    """The global gradient norm when gradients are sharded (ZeRO-1/2: owners; ZeRO-3: shards), clipped."""
    module = pm.wrapped if pm.wrapped is not None else pm.module
    return float(clip_grad_norm_(list(module.parameters()), max_norm, group=pm.groups.dp_group))
