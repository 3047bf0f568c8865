"""Checks for lesson 07: the sharded optimizer (ZeRO-1) and a ZeRO-3 Linear (gather, free, reduce-scatter)."""
from __future__ import annotations

from . import Result, _close, exercise, max_error

# ---- ZeRO-1: ShardedOptimizer(params, optimizer_cls, **kwargs) ----

_SO = dict(steps=3, width=12, depth=2, global_batch=24, lr=1e-2)


def _optimizer_state_bytes(opt) -> int:
    """Bytes of optimizer state tensors held by ``opt`` and any optimizer it keeps in its attributes."""
    import torch
    seen, total, stack = set(), 0, [opt]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.optim.Optimizer):
            for st in o.state.values():
                total += sum(v.numel() * v.element_size() for v in st.values()
                             if isinstance(v, torch.Tensor) and v.dim() > 0)
        for v in vars(o).values():
            items = v if isinstance(v, (list, tuple)) else v.values() if isinstance(v, dict) else [v]
            stack += [i for i in items if isinstance(i, torch.optim.Optimizer)]
    return total


def _sharded_optimizer_harness(answer_cls, steps, width, depth, global_batch, lr):
    import torch
    import torch.distributed as dist

    from ..lessons.memory import _problem
    rank, n = dist.get_rank(), dist.get_world_size()
    model, x, y = _problem(width, depth, global_batch, 0)  # seeded: the same weights on every rank
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = answer_cls(model.parameters(), torch.optim.AdamW, lr=lr)
    b = global_batch // n
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
        for p in model.parameters():  # data parallelism (what DDP does): average the gradients
            dist.all_reduce(p.grad)
            p.grad /= n
        opt.step()
        opt.zero_grad()
    return dict(params={k: v.detach().clone() for k, v in model.state_dict().items()}, initial=initial,
                state_bytes=_optimizer_state_bytes(opt), numel=sum(p.numel() for p in model.parameters()))


@exercise("sharded_optimizer")
def _check_sharded_optimizer(answer, grader):
    from ..lessons.memory import reference
    ref = reference(**_SO)
    for world_size in (2, 4):
        outs = grader.run(world_size, _sharded_optimizer_harness, answer, *_SO.values())
        same = all(_close(o["params"][k], outs[0]["params"][k], rtol=0, atol=0) for o in outs for k in ref["params"])
        bad = [k for k in ref["params"] if not _close(outs[0]["params"][k], ref["params"][k], rtol=1e-5, atol=2e-6)]
        stale = [k for k in bad if _close(outs[0]["params"][k], outs[0]["initial"][k], rtol=0, atol=0)]
        if not same:
            hint = ("the ranks' parameters differ: after stepping its shard, each owner must send its updated "
                    "parameters to every rank (dist.broadcast(p.data, src=owner) for each parameter)")
        elif stale:
            hint = ("some parameters never change on any rank: they were broadcast from a rank that did not update "
                    "them. The src of each broadcast is that parameter's owner, not rank 0")
        else:
            hint = ("the update differs from AdamW on one process: step the optimizer over the owned parameters "
                    "only, once per step, with the kwargs you were given")
        worst = max((max_error(outs[0]["params"][k], ref["params"][k]) for k in bad), default=0.0)
        yield Result(f"{world_size} ranks: equal to AdamW in one process (atol 2e-6, rtol 1e-5)", not bad and same,
                     hint, f"{len(bad)} tensors differ, max error {worst:.1e}" if bad else "")
        full = 8 * outs[0]["numel"]  # AdamW: two fp32 states per parameter
        per_rank = [o["state_bytes"] for o in outs]
        sharded = max(per_rank) <= 1.5 * full / world_size and sum(per_rank) <= 1.05 * full
        yield Result(f"{world_size} ranks: each rank keeps optimizer state for its own shard only", sharded,
                     "build the inner optimizer over the parameters this rank owns, not all of them: that is the "
                     "memory ZeRO-1 saves (each parameter's Adam state lives on exactly one rank)",
                     f"state bytes per rank {per_rank}; all of it is {full}")


# ---- ZeRO-3: a Linear whose weight lives as row shards ----

_Z3 = dict(out_features=8, in_features=6, batch=8)


def _spy_collectives(counts: dict):
    """Wrap the collectives a ZeRO-3 layer might call, counting each; returns the function that undoes it."""
    import torch.distributed as dist
    names = [n for n in ("all_gather_into_tensor", "all_gather_single", "all_gather", "reduce_scatter_tensor",
                         "reduce_scatter_single", "reduce_scatter", "all_reduce", "broadcast") if hasattr(dist, n)]
    originals = {n: getattr(dist, n) for n in names}

    def spy(name):
        def call(*args, **kwargs):
            kind = "all_gather" if name.startswith("all_gather") else \
                "reduce_scatter" if name.startswith("reduce_scatter") else name
            counts[kind] = counts.get(kind, 0) + 1
            return originals[name](*args, **kwargs)
        return call

    for n in names:
        setattr(dist, n, spy(n))

    def restore():
        for n, f in originals.items():
            setattr(dist, n, f)
    return restore


def _zero3_problem(world_size, out_features, in_features, batch):
    import torch
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=g)
    x = torch.randn(batch, in_features, generator=g)
    return weight, x


def _zero3_harness(answer, out_features, in_features, batch):
    import torch
    import torch.distributed as dist
    rank, n = dist.get_rank(), dist.get_world_size()
    weight, x = _zero3_problem(n, out_features, in_features, batch)
    b = batch // n
    xr = x[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    shard = weight.chunk(n)[rank].clone().requires_grad_(True)
    counts: dict = {}
    restore = _spy_collectives(counts)
    try:
        y = answer(xr, shard)
        forward_counts = dict(counts)
        saved = [t.numel() for t in getattr(y.grad_fn, "saved_tensors", ()) if t is not None]
        (y.pow(2).sum() / b).backward()  # this rank's mean; the mean over ranks is the global batch's mean
    finally:
        restore()
    return dict(y=y.detach(), grad_x=xr.grad, grad_shard=shard.grad, saved=saved, counts=counts,
                forward_counts=forward_counts)


def _zero3_reference(world_size, out_features, in_features, batch):
    weight, x = _zero3_problem(world_size, out_features, in_features, batch)
    weight = weight.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    y = x @ weight.T
    (y.pow(2).sum() / batch).backward()
    return y.detach(), x.grad, weight.grad


@exercise("zero3_linear")
def _check_zero3_linear(answer, grader):
    for world_size in (2, 4):
        outs = grader.run(world_size, _zero3_harness, answer, *_Z3.values())
        y, gx, gw = _zero3_reference(world_size, *_Z3.values())
        b = _Z3["batch"] // world_size
        rows = _Z3["out_features"] // world_size
        y_ok = all(_close(o["y"], y[r * b:(r + 1) * b]) for r, o in enumerate(outs))
        yield Result(f"{world_size} ranks: forward equals x @ W.T with the whole weight", y_ok,
                     "all-gather the shards (rank r holds rows r*out/N .. (r+1)*out/N of W) into the full weight, "
                     "in rank order, before the matmul")
        if not y_ok:
            return
        # each rank's loss is the mean over its b samples: its input gradient is N times the global batch's
        gx_ok = all(_close(o["grad_x"], world_size * gx[r * b:(r + 1) * b]) for r, o in enumerate(outs))
        yield Result(f"{world_size} ranks: gradient of the input", gx_ok,
                     "grad_x = grad_y @ W with the WHOLE weight: gather it again in backward")
        got = [o["grad_shard"] for o in outs]
        want = [gw[r * rows:(r + 1) * rows] for r in range(world_size)]
        ok = all(g is not None and _close(g, w) for g, w in zip(got, want))
        if ok:
            hint = ""
        elif all(g is not None and _close(g, w * world_size) for g, w in zip(got, want)):
            hint = (f"your shard's gradient is {world_size}x too large: reduce-scatter SUMS the ranks' gradients; "
                    "divide by the world size to average them, as data parallelism does")
        elif all(g is not None and _close(g, w) for g, w in zip(reversed(got), want)) or any(
                g is not None and any(_close(g, w) for w in want if w is not want[r]) for r, g in enumerate(got)):
            hint = "a rank got another rank's rows: rank r's shard is chunk r of the full gradient (in rank order)"
        else:
            hint = ("grad_W = grad_y.T @ x on each rank, then reduce-scatter it (sum over ranks, each rank keeps its "
                    "own rows) and divide by the world size")
        yield Result(f"{world_size} ranks: each rank's shard gets its rows of the averaged weight gradient", ok, hint)
    full = _Z3["out_features"] * _Z3["in_features"]
    kept = max((max(o["saved"], default=0) for o in outs), default=0)
    yield Result("the whole weight is freed after forward (not saved for backward)", kept < full,
                 "save the input and the shard (ctx.save_for_backward(x, shard)), not the gathered weight: keeping "
                 "it is exactly the memory ZeRO-3 saves. Gather it again in backward",
                 f"largest saved tensor {kept} elements; the whole weight has {full}")
    counts, fwd = outs[0]["counts"], outs[0]["forward_counts"]
    want_counts = {"all_gather": 2, "reduce_scatter": 1}
    if counts == want_counts and fwd == {"all_gather": 1}:
        hint = ""
    elif counts.get("all_reduce"):
        hint = ("an all-reduce gives every rank the whole gradient and moves twice the bytes: a reduce-scatter "
                "gives each rank just its rows")
    elif counts.get("all_gather", 0) < 2:
        hint = "gather the weight once in forward and once again in backward (it was freed in between)"
    else:
        hint = "one all-gather in forward, one all-gather and one reduce-scatter in backward"
    yield Result("communication: all-gather in forward; all-gather and reduce-scatter in backward",
                 not hint, hint, f"forward {fwd}, in all {counts}")


# ---- activation checkpoints under a memory budget (measured with autograd's saved-tensor hooks) ----

_CK = dict(width=16, ffns=(64, 16, 48, 96, 32, 80), batch=32)


def checkpoint_problem():
    """The exercise's model (residual blocks of different widths), its batch, and what each block costs.

    ``activation_bytes[i]``: bytes block i's forward leaves for backward (measured); ``input_bytes[i]``: what it
    keeps when checkpointed (its input); ``recompute_flops[i]``: its forward, done again in backward.
    """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width, ffn):
            super().__init__()
            self.up, self.down = nn.Linear(width, ffn), nn.Linear(ffn, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(_CK["width"], f) for f in _CK["ffns"]])
    x = torch.randn(_CK["batch"], _CK["width"], requires_grad=True)
    per_block = []
    h = x
    for block in model:
        kept, h = kept_activation_bytes(block, h)
        per_block.append(kept)
    inputs = [x.numel() * x.element_size()] * len(model)
    flops = [4 * _CK["batch"] * _CK["width"] * f for f in _CK["ffns"]]
    return model, x, per_block, inputs, flops


def kept_activation_bytes(module, *inputs):
    """Run ``module(*inputs)``; return (bytes autograd saved for backward, parameters excluded; output)."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    return sum(seen.values()), out


def _measure_choice(chosen):
    """Bytes the model keeps for backward with ``chosen`` blocks checkpointed (measured: a checkpointed block's
    input is what autograd still saves for it)."""
    from ..parallel.recompute import checkpoint_blocks, uncheckpoint
    model, x, *_ = checkpoint_problem()
    blocks = checkpoint_blocks(list(model), chosen)
    try:
        kept, _ = kept_activation_bytes(model, x)
    finally:
        uncheckpoint(blocks)
    return kept


def _best_cost(acts, inputs, flops, budget):
    from itertools import combinations
    n = len(acts)
    best = None
    for k in range(n + 1):
        for s in combinations(range(n), k):
            if sum(inputs[i] if i in s else acts[i] for i in range(n)) <= budget:
                cost = sum(flops[i] for i in s)
                best = cost if best is None else min(best, cost)
    return best


@exercise("checkpoint_placement")
def _check_checkpoint_placement(answer, grader):
    _, _, acts, inputs, flops = checkpoint_problem()
    total, floor = sum(acts), sum(inputs)
    # budgets where taking the biggest blocks first saves more than needed (14,336 B = 12,288 + 2,048 exactly)
    budgets = [total, total - 14336, total - 20480, int(total * 0.45), floor]
    for budget in budgets:
        chosen = answer(list(acts), list(inputs), list(flops), budget)
        chosen = sorted(set(int(i) for i in chosen))
        if any(not 0 <= i < len(acts) for i in chosen):
            yield Result(f"budget {budget:,} B: valid block indices", False,
                         f"return indices of blocks, 0 .. {len(acts) - 1}", f"got {chosen}")
            return
        kept = _measure_choice(chosen)
        fits = kept <= budget
        predicted = sum(inputs[i] if i in chosen else acts[i] for i in range(len(acts)))
        hint = ("a checkpointed block still keeps its input (input_bytes[i]): count it, not zero"
                if predicted != sum(acts[i] for i in range(len(acts)) if i not in chosen) and
                sum(acts[i] for i in range(len(acts)) if i not in chosen) <= budget < predicted else
                "checkpoint more blocks: what stays is activation_bytes of the others plus input_bytes of the "
                "checkpointed ones, and it must be <= budget")
        yield Result(f"budget {budget:,} B: measured activations fit", fits, hint,
                     f"measured {kept:,} B kept for backward with blocks {chosen} checkpointed")
        if not fits:
            return
        cost, best = sum(flops[i] for i in chosen), _best_cost(acts, inputs, flops, budget)
        hint = ("checkpointing every block fits any budget, but recomputes the whole forward: checkpoint only what "
                "the budget needs" if len(chosen) == len(acts) else
                "another set of blocks fits with fewer FLOPs recomputed: the largest blocks first can save "
                "more bytes than needed. Try every subset (there are only 2^6), or think knapsack")
        yield Result(f"budget {budget:,} B: no more recomputation than needed", cost == best, hint,
                     f"your blocks recompute {cost:,} FLOPs; the least that fits is {best:,}")
