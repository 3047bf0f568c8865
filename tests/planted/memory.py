"""Wrong ZeRO-1 optimizers and ZeRO-3 Linear functions (lesson 07)."""

import torch
import torch.distributed as dist


def _partition(numels, world_size):
    load, owner = [0] * world_size, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + numels[i]
    return owner


class _Base(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.owner = _partition([p.numel() for p in self.params], dist.get_world_size())
        mine = [p for p, r in zip(self.params, self.owner) if r == dist.get_rank()]
        self.inner = optimizer_cls(mine, **kwargs)


class not_sharded(torch.optim.Optimizer):
    """Every rank steps every parameter: right numbers, no memory saved."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        self.inner = optimizer_cls([p for g in self.param_groups for p in g["params"]], **kwargs)

    def step(self, closure=None):
        self.inner.step()


class no_broadcast(_Base):
    """Owners step their shard and never send it."""

    def step(self, closure=None):
        self.inner.step()


class broadcast_from_rank_zero(_Base):
    """Every parameter broadcast from rank 0, whoever updated it."""

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        for p in self.params:
            dist.broadcast(p.data, src=0)


SHARDED_OPTIMIZER = [not_sharded, no_broadcast, broadcast_from_rank_zero]


def _gather(shard):
    n = dist.get_world_size()
    weight = torch.empty(shard.shape[0] * n, shard.shape[1], dtype=shard.dtype)
    dist.all_gather_into_tensor(weight, shard.contiguous())
    return weight


class _SavesWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard):
        weight = _gather(shard)
        ctx.save_for_backward(x, weight)
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_shard = torch.empty(weight.shape[0] // dist.get_world_size(), weight.shape[1], dtype=weight.dtype)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_y @ weight, grad_shard / dist.get_world_size()


class _Regather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard):
        ctx.save_for_backward(x, shard)
        return x @ _gather(shard).T


class _AllReduce(_Regather):
    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight, n = _gather(shard), dist.get_world_size()
        grad_weight = grad_y.T @ x
        dist.all_reduce(grad_weight)
        return grad_y @ weight, grad_weight.chunk(n)[dist.get_rank()] / n


class _NoAverage(_Regather):
    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight = _gather(shard)
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_y @ weight, grad_shard


class _WrongRows(_Regather):
    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight, n, rank = _gather(shard), dist.get_world_size(), dist.get_rank()
        grad_weight = grad_y.T @ x
        dist.all_reduce(grad_weight)
        return grad_y @ weight, grad_weight.chunk(n)[(rank + 1) % n] / n


def saves_the_gathered_weight(x, shard):
    return _SavesWeight.apply(x, shard)


def all_reduce_instead_of_reduce_scatter(x, shard):
    return _AllReduce.apply(x, shard)


def gradient_not_averaged(x, shard):
    return _NoAverage.apply(x, shard)


def takes_the_next_ranks_rows(x, shard):
    return _WrongRows.apply(x, shard)


ZERO3_LINEAR = [
    saves_the_gathered_weight,
    all_reduce_instead_of_reduce_scatter,
    gradient_not_averaged,
    takes_the_next_ranks_rows,
]


def _kept(acts, inputs, chosen):
    return sum(inputs[i] if i in chosen else acts[i] for i in range(len(acts)))


def checkpoint_everything(activation_bytes, input_bytes, recompute_flops, budget):
    return list(range(len(activation_bytes)))


def largest_first(activation_bytes, input_bytes, recompute_flops, budget):
    order = sorted(range(len(activation_bytes)), key=lambda i: -activation_bytes[i])
    chosen = []
    for i in order:
        if _kept(activation_bytes, input_bytes, chosen) <= budget:
            break
        chosen.append(i)
    return chosen


def forgets_the_kept_inputs(activation_bytes, input_bytes, recompute_flops, budget):
    from itertools import combinations

    n = len(activation_bytes)
    for k in range(n + 1):
        best = min(combinations(range(n), k), key=lambda s: sum(recompute_flops[i] for i in s), default=None)
        fits = [
            s for s in combinations(range(n), k) if sum(activation_bytes[i] for i in range(n) if i not in s) <= budget
        ]
        if fits:
            return list(min(fits, key=lambda s: sum(recompute_flops[i] for i in s)))
    return list(range(n)) if best is None else list(best)


def ignores_the_budget(activation_bytes, input_bytes, recompute_flops, budget):
    return []


CHECKPOINT_PLACEMENT = [checkpoint_everything, largest_first, forgets_the_kept_inputs, ignores_the_budget]


# ---- issue 19: what a rank holds while it steps, saved tensors below the output node, world size 3 ----
class full_state_during_step(_Base):
    """Right numbers, and the owned shard kept between steps, but every step builds a full-size scratch copy of
    every parameter's moments (and drops it after): twice the memory while it steps."""

    @torch.no_grad()
    def step(self, closure=None):
        scratch = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]  # noqa: F841
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


class moments_in_own_dicts(_Base):
    """Right numbers, but also keeps a copy of every parameter's gradient history in a dict of its own."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
        self.history = {}

    @torch.no_grad()
    def step(self, closure=None):
        for i, p in enumerate(self.params):
            self.history.setdefault(i, torch.zeros_like(p)).add_(p.grad)
            self.history.setdefault(-1 - i, torch.zeros_like(p)).add_(p.grad * p.grad)
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


class bitmask_owner_in_broadcast(torch.optim.Optimizer):
    """Steps parameter i on rank i % n but broadcasts it from rank i & (n - 1): the same for 2 and 4 ranks; on 3,
    rank 1's updates are overwritten by a rank that never stepped them."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        self.params = [p for g in self.param_groups for p in g["params"]]
        n, rank = dist.get_world_size(), dist.get_rank()
        self.inner = optimizer_cls([p for i, p in enumerate(self.params) if i % n == rank], **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        n = dist.get_world_size()
        for i, p in enumerate(self.params):
            dist.broadcast(p.data, src=i & (n - 1))


class zero_grad_of_inner_only(_Base):
    """Right until the second step: zero_grad clears only the inner optimizer's (owned) gradients, so the other
    parameters' gradients pile up across steps on every rank."""

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)


SHARDED_OPTIMIZER += [full_state_during_step, moments_in_own_dicts, bitmask_owner_in_broadcast, zero_grad_of_inner_only]


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard):
        return _gather(shard)

    @staticmethod
    def backward(ctx, grad_weight):
        n = dist.get_world_size()
        grad_shard = torch.empty(grad_weight.shape[0] // n, grad_weight.shape[1], dtype=grad_weight.dtype)
        dist.reduce_scatter_tensor(grad_shard, grad_weight.contiguous())
        return grad_shard / n


def weight_saved_behind_a_reshape(x, shard):
    """Gathers in an autograd.Function, then lets autograd's matmul keep the whole weight; a reshape on top hides
    it from the output node's saved_tensors."""
    return (x @ _Gather.apply(shard).T).reshape(x.shape[0], -1)


def weight_saved_below_a_scale(x, shard):
    """The same, with a multiplication by 1 as the output node."""
    return torch.nn.functional.linear(x, _Gather.apply(shard)) * 1.0


ZERO3_LINEAR += [weight_saved_behind_a_reshape, weight_saved_below_a_scale]


def best_ratio_first(activation_bytes, input_bytes, recompute_flops, budget):
    """Greedy: the most bytes saved per FLOP recomputed first, until it fits."""
    saved = [a - i for a, i in zip(activation_bytes, input_bytes)]
    order = sorted(range(len(saved)), key=lambda i: -saved[i] / recompute_flops[i])
    chosen = []
    for i in order:
        if _kept(activation_bytes, input_bytes, chosen) <= budget:
            break
        chosen.append(i)
    return chosen


def strict_budget(activation_bytes, input_bytes, recompute_flops, budget):
    """The optimum, but with `<` for `<=`: a set that keeps exactly the budget is refused."""
    from itertools import combinations

    n = len(activation_bytes)
    fits = [
        s for k in range(n + 1) for s in combinations(range(n), k) if _kept(activation_bytes, input_bytes, s) < budget
    ]
    return list(min(fits, key=lambda s: sum(recompute_flops[i] for i in s))) if fits else list(range(n))


CHECKPOINT_PLACEMENT += [best_ratio_first, strict_budget]


# ---- issue 47: an exhaustive search capped at 8 blocks; the "no grader calls" watch switched off ----
def capped_at_eight_blocks(activation_bytes, input_bytes, recompute_flops, budget):
    """The right exhaustive search over the first 8 blocks only (a cap "to keep it fast"); the others are always
    checkpointed. Right on every problem of at most 8 blocks, which were all the old checks drew."""
    from itertools import combinations

    n = len(activation_bytes)
    head, tail = list(range(min(n, 8))), list(range(min(n, 8), n))
    fits = [
        list(s) + tail
        for k in range(len(head) + 1)
        for s in combinations(head, k)
        if sum(input_bytes[i] if i in s or i in tail else activation_bytes[i] for i in range(n)) <= budget
    ]
    return min(fits, key=lambda s: (sum(recompute_flops[i] for i in s), s)) if fits else list(range(n))


def switches_off_the_watch(activation_bytes, input_bytes, recompute_flops, budget):
    """Turns off the grader's profile hook (sys.setprofile(None)) and returns the grader's own reference answer."""
    import sys

    sys.setprofile(None)
    from simlib.grading import checkpointing

    return list(checkpointing._best_set(activation_bytes, input_bytes, recompute_flops, budget))


CHECKPOINT_PLACEMENT += [capped_at_eight_blocks, switches_off_the_watch]


class state_outside_torch(_Base):
    """Right numbers, sharded stepping, but a full copy of Adam's two moments for EVERY parameter kept in
    torch.frombuffer(bytearray(...)) tensors: memory torch's profiler and NumPy never see (issue 47)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
        self.moments = [
            (
                torch.frombuffer(bytearray(4 * p.numel()), dtype=torch.float32),
                torch.frombuffer(bytearray(4 * p.numel()), dtype=torch.float32),
            )
            for p in self.params
        ]

    @torch.no_grad()
    def step(self, closure=None):
        for p, (m, v) in zip(self.params, self.moments):  # a moment of every parameter, kept on every rank
            m.mul_(0.9).add_(p.grad.reshape(-1), alpha=0.1)
            v.mul_(0.999).addcmul_(p.grad.reshape(-1), p.grad.reshape(-1), value=0.001)
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


SHARDED_OPTIMIZER += [state_outside_torch]


class no_empty_shard_guard(_Base):
    """The solution without its guard: the inner optimizer built over this rank's parameters even when it owns
    none (torch refuses an empty list). Right whenever every rank owns something (issue 47)."""

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        for p, r in zip(self.params, self.owner):
            dist.broadcast(p.data, src=r)


SHARDED_OPTIMIZER += [no_empty_shard_guard]


# ---- issue 47 (h-grader): a float32 buffer for a float64 layer; [] when nothing fits ----
class _DefaultDtype(torch.autograd.Function):
    """The solution, but the gathered weight is allocated in the default float32 (torch.empty without dtype)."""

    @staticmethod
    def forward(ctx, x, shard):
        n = dist.get_world_size()
        weight = torch.empty(shard.shape[0] * n, shard.shape[1])
        dist.all_gather_into_tensor(weight, shard.float().contiguous())
        ctx.save_for_backward(x, shard)
        return (x.float() @ weight.T).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        n = dist.get_world_size()
        weight = torch.empty(shard.shape[0] * n, shard.shape[1], dtype=shard.dtype)
        dist.all_gather_into_tensor(weight, shard.contiguous())
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, (grad_y.T @ x).contiguous())
        return grad_y @ weight, grad_shard / n


def gathers_into_the_default_dtype(x, shard):
    return _DefaultDtype.apply(x, shard)


ZERO3_LINEAR += [gathers_into_the_default_dtype]


def empty_when_nothing_fits(activation_bytes, input_bytes, recompute_flops, budget):
    """The optimum whenever some set fits; [] (no checkpoint: the most memory) when none does."""
    from itertools import combinations

    n = len(activation_bytes)
    fits = [
        s for k in range(n + 1) for s in combinations(range(n), k) if _kept(activation_bytes, input_bytes, s) <= budget
    ]
    return list(min(fits, key=lambda s: sum(recompute_flops[i] for i in s))) if fits else []


CHECKPOINT_PLACEMENT += [empty_when_nothing_fits]
