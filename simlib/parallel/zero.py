"""ZeRO stages 1, 2 and 3, built from collectives (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", §5; torch's FSDP2 ``fully_shard`` is the maintained reference).

Plain data parallelism keeps everything on every rank: weights, gradients, optimizer states. ZeRO removes the
copies stage by stage, each rank keeping only the part it *owns*:

    stage 1  ShardedOptimizer       optimizer states of owned parameters only; each rank steps what it owns,
                                    then every parameter is broadcast from its owner
    stage 2  ZeroDataParallel(2)    + each gradient is reduced to its owner during backward and freed elsewhere
    stage 3  Zero3 (zero3.py)       + weights: each block's parameters live as one flat 1/N shard per rank,
                                    all-gathered before the block's forward and again before its backward,
                                    freed after each; gradients reduce-scattered back to the shards

Stages 1 and 2 give whole tensors to owners (greedy by size), so any ``torch.optim`` optimizer works unchanged and
parameter counts never need to divide the world size. Stage 3 shards flat buffers (padded to a multiple of the
world size), which is exact for optimizers that update element by element (SGD, Adam, AdamW, ...); others are
refused with a clear error. Gradients are averaged over the data-parallel group, as DDP does.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "partition",
    "ShardedOptimizer",
    "ZeroDataParallel",
    "ELEMENTWISE_OPTIMIZERS",
    "clip_grad_norm_",
    "state_bytes",
]

# optimizers whose update of an element depends only on that element's gradient and state: exact on flat shards
ELEMENTWISE_OPTIMIZERS = (
    "SGD",
    "Adam",
    "AdamW",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "ASGD",
    "Rprop",
    "MasterWeightsOptimizer",
)


# torch 2.13 renamed the tensor-in/tensor-out collectives; older torch (>= 2.4) has the first names only
all_gather_shards = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_shards = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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


def _count(counter, kind, tensor):
    """Log the bytes this rank hands to a collective in ``counter`` (a ``simlib.parallel.comm_log.CommLog``)."""
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
        self._local_groups = [g for g in self.param_groups if any(self.owner[p] == self.rank for p in g["params"])]
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
            flat = (
                torch.cat([p.detach().reshape(-1) for p in params])
                if self.rank == owner
                else torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
            )
            _count(self.comm_counter, "broadcast", flat)
            dist.broadcast(flat, src=_global_rank(self.group, owner), group=self.group)
            if self.rank != owner:
                offset = 0
                for p in params:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
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
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local": self.local.state_dict() if self.local is not None else None,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
        }

    def load_state_dict(self, state_dict) -> None:
        if state_dict.get("world_size") != self.world_size or state_dict.get("rank") != self.rank:
            raise ValueError(
                f"rank {self.rank}: this optimizer state was saved by rank {state_dict.get('rank')} of "
                f"{state_dict.get('world_size')}; a ZeRO-1 shard loads only on the same rank and world "
                "size (save through torch.distributed.checkpoint to re-shard)"
            )
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        if self.local is not None:
            self.local.load_state_dict(state_dict["local"])

    def __repr__(self) -> str:
        mine = sum(p.numel() for p in self.owned_parameters)
        total = sum(p.numel() for p in self.owner)
        return (
            f"ShardedOptimizer({self.optimizer_cls.__name__}, rank {self.rank}/{self.world_size} owns "
            f"{mine:,} of {total:,} parameters)"
        )


# ---------------------------------------------------------------- stages 1-2: gradients to their owners


class ZeroDataParallel(nn.Module):
    """Data parallelism for ZeRO-1/2: each gradient is reduced (summed, then divided) onto its owner only.

    ``stage=2`` frees the gradient on every other rank as soon as it is sent, so a rank holds only the
    gradients it owns; ``stage=1`` keeps them (zeros' worth of memory for the same communication). Ownership
    comes from ``optimizer.owner`` (a :class:`ShardedOptimizer` over the same parameters), so the reduce goes
    where the update happens. A reduce to each owner is one reduce-scatter cut along tensor boundaries.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: ShardedOptimizer | None = None,
        stage: int = 2,
        group=None,
        comm_counter=None,
    ):
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
        self._handles = [
            p.register_post_accumulate_grad_hook(self._reduce) for p in module.parameters() if p.requires_grad
        ]
        if optimizer is not None:
            self.attach(optimizer)

    def attach(self, optimizer: ShardedOptimizer) -> None:
        """Reduce each gradient to the rank that ``optimizer`` (a ShardedOptimizer) says owns it."""
        if not isinstance(optimizer, ShardedOptimizer):
            raise TypeError(
                "ZeroDataParallel needs the ShardedOptimizer over the same parameters (it decides "
                f"which rank owns each gradient), got {type(optimizer).__name__}"
            )
        missing = [n for n, p in self.module.named_parameters() if p.requires_grad and p not in optimizer.owner]
        if missing:
            raise ValueError(
                f"rank {self.rank}: parameters {missing[:3]} need gradients but are not in the "
                "ShardedOptimizer: build it over model.parameters() (frozen ones may be left out)"
            )
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
            raise RuntimeError(
                f"rank {self.rank}: ZeroDataParallel has no optimizer yet: pass the ShardedOptimizer "
                "(or call .attach(optimizer)) before the first backward"
            )
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
