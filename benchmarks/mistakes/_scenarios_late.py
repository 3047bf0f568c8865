"""Scenarios for lessons 07-13 (see ``_scenarios.py``, which holds lessons 01-05 and the helpers)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.utils._python_dispatch
from _scenarios import _Collectives, _dtype, _seeded, _values


# ── lesson 07-08 ────────────────────────────────────────────────────────────────────────────────────────────────
def checkpoint_placement(answer, spec):
    act, inp, flops, budget = spec["activation_bytes"], spec["input_bytes"], spec["recompute_flops"], spec["budget"]
    chosen = sorted(set(int(i) for i in answer(list(act), list(inp), list(flops), budget)))
    kept = sum(inp[i] if i in chosen else act[i] for i in range(len(act)))
    return dict(fits=kept <= budget, recomputed_flops=sum(flops[i] for i in chosen))


def _optimizer_state_bytes(obj, seen=None, depth=0):
    """Bytes of tensors in the state of every optimizer reachable from ``obj`` (attributes, lists, dicts)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth > 3:
        return 0
    seen.add(id(obj))
    total = 0
    if isinstance(obj, torch.optim.Optimizer):
        for st in obj.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    total += v.numel() * v.element_size()
    children = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    if isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    for ch in children:
        if (
            isinstance(ch, (torch.optim.Optimizer, list, tuple, dict))
            or hasattr(ch, "__dict__")
            and not isinstance(ch, (torch.Tensor, torch.nn.Module, type))
        ):
            total += _optimizer_state_bytes(ch, seen, depth + 1)
    return total


def sharded_optimizer(answer, spec):
    """Weights after the steps and the optimizer state each rank holds (torch tensors in any optimizer's state,
    plus Python-heap bytes traced by tracemalloc: state kept outside torch is weighed too)."""
    import tracemalloc

    rank = dist.get_rank()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(_seeded(20 + i, *shape)) for i, shape in enumerate(spec["shapes"])]
    tracemalloc.start()
    opt = answer(params, torch.optim.AdamW, lr=spec.get("lr", 0.01), weight_decay=spec.get("weight_decay", 0.1))
    error = None
    with _Collectives() as c:  # what the steps sent (an all-reduce where a broadcast from the owner is due)
        for step in range(spec.get("steps", 3)):
            for i, p in enumerate(params):
                p.grad = _seeded(1000 * step + i, *p.shape)  # the same (averaged) gradient on every rank
            try:
                opt.step()
            except Exception as exc:  # noqa: BLE001
                error = f"{type(exc).__name__}: {exc}"[:200]
                break
    outside_torch, _ = tracemalloc.get_traced_memory()  # Python-heap bytes still held: bytearray, NumPy, ...
    tracemalloc.stop()
    numel = sum(p.numel() for p in params)
    return dict(
        weights=[_values(p) for p in params],
        error=error,
        torch_state_bytes_per_element=round(_optimizer_state_bytes(opt) / numel, 1),
        collectives=c.seen,
        # asked for by a proof on large tensors only: on a few dozen elements Python's own objects dominate
        bytes_held_outside_torch_per_element=round(outside_torch / numel) if spec.get("weigh_heap") else None,
    )


def zero3_linear(answer, spec):
    rank, n = dist.get_rank(), dist.get_world_size()
    din, dout, b = spec.get("d_in", 5), spec["d_out"], spec.get("batch", 3)
    dtype = _dtype(spec.get("dtype"))
    w = _seeded(1, dout, din, dtype=dtype)
    shard = w.chunk(n)[rank].clone().requires_grad_()
    x = _seeded(10 + rank, b, din, dtype=dtype).requires_grad_()
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with _Collectives() as c, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = answer(x, shard)
    import numpy as np

    on_ctx = vars(y.grad_fn).values() if y.grad_fn is not None and hasattr(y.grad_fn, "__dict__") else []
    kept = sum(saved) + sum(
        v.numel() if isinstance(v, torch.Tensor) else v.size
        for v in on_ctx
        if isinstance(v, (torch.Tensor, np.ndarray))
    )
    with _Collectives() as c2:
        (y * _seeded(7 + rank, *y.shape, dtype=dtype)).sum().backward()
    return dict(
        y=_values(y),
        dx=_values(x.grad),
        dshard=_values(shard.grad),
        kept_elements_over_x_and_shard=kept > x.numel() + shard.numel(),
        collectives_forward=c.seen,
        collectives_backward=c2.seen,
    )


def full_state(answer, spec):
    """Losses of the steps after a restart from a checkpoint equal the uninterrupted run's."""
    import random
    import tempfile

    import numpy as np

    from simlib import checkpoint

    rank = dist.get_rank()
    total, stop = spec.get("steps", 6), spec.get("save_at", 4)

    def fresh(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )
        for p in model.parameters():  # the same weights on every rank, whatever the seed
            dist.broadcast(p.data, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * 0.5 * (1 + math.cos(s / 9)))
        torch.manual_seed(1234 + rank + seed)  # every rank draws its own dropout masks (and augmentation noise)
        random.seed(99 + rank + seed)
        np.random.seed(77 + rank + seed)
        return answer(model=model, optimizer=opt, scheduler=sched)

    def train(state, until):
        losses = []
        while state.step < until:
            g = torch.Generator().manual_seed(state.data_step * 10 + rank)
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            x = (
                x + random.gauss(0.0, 0.1) + torch.from_numpy(np.random.normal(0.0, 0.1, (8, 6))).float()
            )  # augmentation
            loss = torch.nn.functional.mse_loss(state.model(x), y)
            loss.backward()
            for p in state.model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.scheduler.step()
            state.step += 1
            state.data_step += 1
            losses.append(round(loss.item(), 7))
        return losses

    whole = train(fresh(0), total)
    with tempfile.TemporaryDirectory() as tmp:
        directory = [tmp]
        dist.broadcast_object_list(directory, 0)
        state = fresh(0)
        train(state, stop)
        checkpoint.save(directory[0], state)
        dist.barrier()
        restarted = fresh(7)  # another process: other weights, other generators
        checkpoint.load_latest(directory[0], restarted)
        resumed = train(restarted, total)
        dist.barrier()
    return dict(losses_after_restart=resumed, uninterrupted=whole[stop:])


# ── lesson 09, 09b, 13 ──────────────────────────────────────────────────────────────────────────────────────────
def ring_attention(answer, spec):
    rank, n = dist.get_rank(), dist.get_world_size()
    b, h, local, d = spec.get("batch", 1), spec.get("heads", 2), spec.get("local", 3), spec.get("head_dim", 4)
    dtype = _dtype(spec.get("dtype"))
    scale = spec.get("scale", 1.0)
    q, k, v = (
        _seeded(s, b, h, n * local, d, scale=scale, dtype=dtype).chunk(n, dim=2)[rank].contiguous() for s in (1, 2, 3)
    )
    with _Collectives() as c:
        out = answer(q, k, v, spec.get("causal", False))
    return dict(out=_values(out), collectives=c.seen)


def moe_dispatch(answer, spec):
    from simlib.parallel.experts import capacity  # noqa: F401  (the solution's import, kept warm)

    rank, ep = dist.get_rank(), dist.get_world_size()
    tokens, hidden, num_experts = spec["tokens"], spec.get("hidden", 4), spec["experts"]
    torch.manual_seed(0)
    router = torch.nn.Linear(hidden, num_experts)
    with torch.no_grad():
        router.bias[0] += spec.get("skew", 0.0)
    experts = [torch.nn.Linear(hidden, hidden) for _ in range(num_experts)]
    local = num_experts // ep
    x = _seeded(100 + rank, tokens, hidden)
    with torch.no_grad(), _Collectives() as c, _Elements() as sent:
        y = answer(
            x,
            router,
            torch.nn.ModuleList(experts[rank * local : (rank + 1) * local]),
            num_experts,
            spec.get("capacity_factor", 1.0),
        )
    return dict(y=_values(y), collectives=c.seen, elements_through_collectives=sent.elements)


class _Elements(torch.utils._python_dispatch.TorchDispatchMode):
    """Elements of the tensors handed to collectives (c10d ops, below every Python name): tokens sent over capacity
    make the all-to-all's buffers larger."""

    elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket).startswith("c10d."):
            stack = list(args)
            while stack:
                a = stack.pop()
                if isinstance(a, torch.Tensor):
                    self.elements += a.numel()
                elif isinstance(a, (list, tuple)):
                    stack.extend(a)
        return func(*args, **(kwargs or {}))


def zero3_prefetch(answer, spec):
    from simlib.parallel import zero_prefetch

    rank = dist.get_rank()
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()) for _ in range(spec.get("blocks", 3))]
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), *blocks, torch.nn.Linear(6, 2))
    z = answer(model, blocks=blocks)
    opt = torch.optim.AdamW(z.parameters(), lr=0.05)
    in_flight_max, real = 0, zero_prefetch.issue_gather

    def issue(unit):
        nonlocal in_flight_max
        started = real(unit)
        in_flight_max = max(in_flight_max, sum(getattr(u, "work", None) is not None for u in z.units))
        return started

    zero_prefetch.issue_gather = issue
    answer_globals = type(z).on_forward.__globals__
    had = answer_globals.get("issue_gather")
    if had is real:
        answer_globals["issue_gather"] = issue
    losses = []
    try:
        with _Collectives() as c:  # every collective the steps ran (a gather out of sight of dispatch modes too)
            for step in range(2):
                x, y = _seeded(10 * step + rank, 3, 4), _seeded(10 * step + rank + 5, 3, 2)
                loss = torch.nn.functional.mse_loss(z(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(round(loss.item(), 6))
    finally:
        zero_prefetch.issue_gather = real
        if had is real:
            answer_globals["issue_gather"] = real
    full = z.full_state_dict()
    return dict(
        losses=losses,
        weights={k: _values(v) for k, v in full.items()},
        counts=dict(z.counts),
        units_in_flight_at_most=in_flight_max,
        blocks_units=max(len(b) for b in z.blocks),
        collectives=c.seen,
    )


def plan_memory(answer, spec):
    from simlib import sim

    model = sim.gpt(*spec["model"], **spec.get("model_kw", {}))
    strategy = sim.Strategy(**spec["strategy"])
    out = answer(model, strategy)
    return {k: float(out[k]) for k in ("weights", "gradients", "optimizer", "activations", "total")}
