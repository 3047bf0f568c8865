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
        grad_shard = torch.empty(weight.shape[0] // dist.get_world_size(), weight.shape[1])
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


ZERO3_LINEAR = [saves_the_gathered_weight, all_reduce_instead_of_reduce_scatter, gradient_not_averaged,
                takes_the_next_ranks_rows]


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
        fits = [s for s in combinations(range(n), k)
                if sum(activation_bytes[i] for i in range(n) if i not in s) <= budget]
        if fits:
            return list(min(fits, key=lambda s: sum(recompute_flops[i] for i in s)))
    return list(range(n)) if best is None else list(best)


def ignores_the_budget(activation_bytes, input_bytes, recompute_flops, budget):
    return []


CHECKPOINT_PLACEMENT = [checkpoint_everything, largest_first, forgets_the_kept_inputs, ignores_the_budget]
