"""Scenarios for lessons 07-13 (see ``_scenarios.py``, which holds lessons 01-05 and the helpers)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
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
    with torch.no_grad(), _Collectives() as c:
        y = answer(
            x,
            router,
            torch.nn.ModuleList(experts[rank * local : (rank + 1) * local]),
            num_experts,
            spec.get("capacity_factor", 1.0),
        )
    return dict(y=_values(y), collectives=c.seen)


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
    )


def plan_memory(answer, spec):
    from simlib import sim

    model = sim.gpt(*spec["model"], **spec.get("model_kw", {}))
    strategy = sim.Strategy(**spec["strategy"])
    out = answer(model, strategy)
    return {k: float(out[k]) for k in ("weights", "gradients", "optimizer", "activations", "total")}


# ── project 3 (finance) pieces ──────────────────────────────────────────────────────────────────────────────────
def _paths_task(spec):
    from types import SimpleNamespace

    keys = ("block", "days", "vol", "seed")
    return SimpleNamespace(global_batch=spec["blocks"] * spec["block"], **{k: spec[k] for k in keys})


def finance_paths(answer, spec):
    """What is true of this rank's paths, as properties (any right answer shows the same): rows and width, the same
    paths when asked again, paths repeated across ranks or the two steps (all ranks' rows gathered), the union
    equal to one process's batch, and (on the whole union) zero drift and the volatility within 5 standard errors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Normals(TorchDispatchMode):  # the normal numbers this rank draws (below every Python name)
        drawn = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if "normal" in str(func) or "randn" in str(func):
                _Normals.drawn += out.numel() if isinstance(out, torch.Tensor) else 0
            return out

    rank, world = dist.get_rank(), dist.get_world_size()
    task, step = _paths_task(spec), spec["step"]
    with _Normals():
        first = answer(task, step, rank, world)
    nxt, again = (answer(task, s, rank, world) for s in (step + 1, step))
    mine = [[round(float(v), 9) for v in row] for row in torch.cat([first, nxt]).double()]
    everyone = [None] * world
    dist.all_gather_object(everyone, (first.double().tolist(), mine))
    union = [tuple(round(v, 9) for v in row) for rows, _ in everyone for row in rows]
    rows = [tuple(r) for _, m in everyone for r in m]
    alone = [tuple(round(float(v), 9) for v in row) for row in answer(task, step, 0, 1).double()]
    out = dict(
        rows=int(first.shape[0]),
        normals_drawn=_Normals.drawn,  # simulating only this rank's share: its rows x days
        width=int(first.shape[1]) if first.dim() == 2 else None,
        same_again=bool(torch.equal(first, again)),
        repeated_rows=len(rows) - len(set(rows)),
        union_is_one_process=sorted(union) == sorted(alone),
    )
    if spec.get("stats") and union:
        p = torch.tensor(union, dtype=torch.float64)
        r = torch.log(p[:, 1:] / p[:, :-1])
        sd, want = float(r.std()), task.vol * math.sqrt(1 / 252)
        out["starts_at_one"] = bool(torch.all(p[:, 0] == 1))
        out["vol_right"] = abs(sd / want - 1) < 5 / math.sqrt(2 * r.numel()) + 0.01
        out["drift_right"] = abs(float(r.mean()) + 0.5 * task.vol**2 / 252) < 5 * want / math.sqrt(r.numel())
    return out


def finance_grad_average(answer, spec):
    """Every rank: a small hedging network (a frozen premium, a parameter no forward uses) backward on this rank's
    ``counts[rank]`` paths (none: no backward, loss nan), then the answer; the gradients, the returned loss and the
    collectives it called. The solution gives the one-process gradient of all paths on every rank."""
    from simlib.projects.finance.task import HedgeNet

    rank = dist.get_rank()
    torch.manual_seed(spec.get("seed", 0))
    model = HedgeNet(spec["days"], 0.3, hidden=spec["hidden"], depth=1)
    for p in model.net[-1].parameters():
        torch.nn.init.normal_(p, std=0.3)
    model.premium.requires_grad_(False)
    model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))
    n = spec["counts"][rank]
    x = torch.cat([torch.ones(n, 1), torch.exp(torch.cumsum(0.02 * _seeded(50 + rank, n, spec["days"]), 1))], 1)
    loss = float("nan")
    if n:
        out = torch.mean((model(x) - (x[:, -1] - 1).clamp_min(0)) ** 2)
        out.backward()
        loss = float(out.detach())
    with _Collectives() as c:
        got = answer(list(model.parameters()), loss, n, None)
    return dict(
        grads=[_values(p.grad) for p in model.parameters()],
        loss=float(got) if isinstance(got, (int, float)) else str(got),
        collectives=c.seen,
    )


# ── project 2's pieces (solutions/11_vision_pieces.ipynb) ──────────────────────────────────────────────────────────
def sync_batchnorm(answer, spec):
    """The answer inside the course's SyncBatchNorm layer (where training runs it) on this rank's part of a batch
    whose ranks hold ``sizes`` samples, their means ``spread`` apart around ``center``: two training steps (outputs,
    input and parameter gradients), the running statistics, the eval output, and the collectives that ran."""
    from simlib import pieces
    from simlib.parallel.batchnorm import SyncBatchNorm

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes, c, (h, w) = spec["sizes"], spec.get("channels", 3), spec.get("hw", (2, 2))
    g = torch.Generator().manual_seed(spec.get("seed", 0))
    owner = torch.repeat_interleave(torch.arange(world), torch.tensor(sizes))
    means = spec.get("center", 0.0) + spec.get("spread", 1.0) * torch.randn(world, c, generator=g, dtype=torch.float64)
    layer = SyncBatchNorm(c, eps=spec.get("eps", 1e-5), momentum=spec.get("momentum", 0.1))
    with torch.no_grad():
        layer.weight.copy_(1 + 0.5 * torch.randn(c, generator=g))
        layer.bias.copy_(torch.randn(c, generator=g))
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    steps = []
    with pieces.using({"sync_batchnorm": answer}), _Collectives() as col:
        for _ in range(2):
            x = spec.get("scale", 1.0) * torch.randn(len(owner), c, h, w, generator=g, dtype=torch.float64)
            x = (x + means[owner].view(-1, c, 1, 1)).float()
            gy = torch.randn(len(owner), c, h, w, generator=g)
            xs = x[lo:hi].clone().requires_grad_()
            y = layer(xs)
            (y * gy[lo:hi]).sum().backward()
            steps.append(
                dict(
                    y=_values(y),
                    grad_x=_values(xs.grad),
                    grad_w=_values(layer.weight.grad),
                    grad_b=_values(layer.bias.grad),
                )
            )
            layer.weight.grad = layer.bias.grad = None
    layer.eval()
    with torch.no_grad():
        y_eval = layer((torch.randn(2, c, h, w, generator=g) + spec.get("center", 0.0)).float())
    return dict(
        steps=steps,
        running_mean=_values(layer.running_mean),
        running_var=_values(layer.running_var),
        eval=_values(y_eval),
        collectives=col.seen,
    )


def data_shard(answer, spec):
    """Each step's part on this rank (the training's order: a permutation per epoch from a fixed seed), the same
    again under another global random state, and whether a batch that does not split was refused."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n, b = spec["num_samples"], spec["global_batch"]

    def order(epoch):
        return torch.randperm(n, generator=torch.Generator().manual_seed(1234 + epoch))

    torch.manual_seed(100 + rank)
    parts = []
    for step in range(spec.get("steps", 6)):
        got = answer(step, rank, world, b, n, order)
        parts.append(dict(type=type(got).__name__, values=[int(v) for v in got] if got is not None else None))
    torch.manual_seed(999 + rank)
    again = answer(1, rank, world, b, n, order)
    try:
        answer(0, rank, world, world + 1, n, order)  # a batch that does not split into world_size parts
        refused = False
    except Exception:  # noqa: BLE001 - any error is a refusal
        refused = True
    return dict(parts=parts, again=[int(v) for v in again], refused=refused)
# ── project 10: the GPT's pieces (solutions/10_gpt_pieces.ipynb) ───────────────────────────────────────────────────
def _subgroup(spec):
    """``spec["groups"]`` (lists of ranks, e.g. a dp x tp mesh's data-parallel groups): this rank's group and index;
    (None, 0) without."""
    if not spec.get("groups"):
        return None, 0
    rank = dist.get_rank()
    made = [dist.new_group(ranks) for ranks in spec["groups"]]  # every rank makes every group, in order
    index = next(i for i, ranks in enumerate(spec["groups"]) if rank in ranks)
    return made[index], index


def gpt_grad_sync(answer, spec):
    """Gradients after the first step (None kept), weights after the steps, the collectives below Python, and the
    elements in flight (started, not yet waited for) while backward made gradients: the overlap."""
    from _scenarios import _batch, _mlp

    rank = dist.get_rank()
    group, index = _subgroup(spec)
    model = _mlp(spec, seed=index)  # one model per data-parallel group, the same on its ranks
    events, real = [], dist.all_reduce

    class _Handle:
        def __init__(self, work, n):
            self.work, self.n = work, n

        def wait(self, *a, **k):
            events.append(("wait", self.n))
            return self.work.wait(*a, **k)

        def is_completed(self):
            return self.work.is_completed()

    def all_reduce(tensor, *args, async_op=False, **kwargs):
        n = len([e for e in events if e[0] == "start"])
        events.append(("start", n, bool(async_op), tensor.numel()))
        work = real(tensor, *args, async_op=async_op, **kwargs)
        return _Handle(work, n) if async_op else work

    dist.all_reduce = all_reduce
    grads, error = None, None
    try:
        kwargs = {} if group is None else {"group": group}
        sync = answer(model, bucket_cap_mb=spec.get("bucket_cap_mb", 100 / 2**20), **kwargs)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: events.append(("grad",)))
        with _Collectives() as c:
            for step in range(spec.get("steps", 2)):
                x, y = _batch(spec, rank * 10 + step)
                torch.nn.functional.mse_loss(sync(x), y).backward()
                sync.finish_gradient_synchronization()
                if step == 0:
                    grads = [_values(p.grad) for p in model.parameters()]
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p -= 0.1 * p.grad
                            p.grad = None
    except Exception as e:  # noqa: BLE001 - an answer that breaks is an observable too
        error, c = f"{type(e).__name__}: {e}"[:200], None
    finally:
        dist.all_reduce = real
    in_flight, overlapped = {}, 0
    for e in events:
        if e[0] == "start" and e[2]:
            in_flight[e[1]] = e[3]
        elif e[0] == "wait":
            in_flight.pop(e[1], None)
        elif e[0] == "grad":
            overlapped += sum(in_flight.values())
    return dict(
        error=error,
        grads=grads,
        weights=[_values(p) for p in model.parameters()],
        elements_in_flight_during_backward=overlapped,
        all_reduced_elements=sum(e[3] for e in events if e[0] == "start"),
        collectives=c.seen if c is not None else None,
    )


def gpt_tp_attention(answer, spec):
    """The split block's output, dL/dx and its parameters' gradients (the unsplit block's, seeded, on every rank),
    the collectives below Python; or, where the answer refuses, whether its message names the heads and tp."""
    from simlib.models import SelfAttention

    group, _ = _subgroup(spec)
    tp = dist.get_world_size(group)
    heads, head_dim = spec["heads"], spec.get("head_dim", 3)
    torch.manual_seed(7)
    attn = SelfAttention(heads * head_dim, heads, causal=True)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    b, s = spec.get("batch", 2), spec.get("seq", 5)
    x = _seeded(1, b, s, heads * head_dim).requires_grad_()
    try:
        mod = answer(attn, group)
    except Exception as e:  # noqa: BLE001 - a refusal is the observable here
        message = str(e)
        return dict(refused=type(e).__name__, names_cause=str(heads) in message and str(tp) in message)
    with _Collectives() as c:
        y = mod(x)
        (y * _seeded(2, b, s, heads * head_dim)).sum().backward()
    return dict(
        refused=None,
        y=_values(y),
        dx=_values(x.grad),
        grads={k: _values(p.grad) for k, p in sorted(mod.named_parameters())},
        collectives=c.seen,
    )
