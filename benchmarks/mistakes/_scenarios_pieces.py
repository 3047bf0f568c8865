"""Scenarios for the projects' learner pieces (see ``_scenarios.py``, which holds lessons 01-05 and the helpers;
``_scenarios_late.py``: lessons 07-13)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from _scenarios import _Collectives, _seeded, _values


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
