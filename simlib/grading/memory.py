"""Checks for lesson 07: the sharded optimizer (ZeRO-1) and a ZeRO-3 Linear (gather, free, reduce-scatter)."""
from __future__ import annotations

from .core import AnswerTimeout, Result, UsedTheGrader, _close, exercise, max_error, refuse_grader_calls
from .weighing import _alive_after, _step_memory  # noqa: F401 - _step_memory: the accumulation test's

# ---- ZeRO-1: ShardedOptimizer(params, optimizer_cls, **kwargs) ----

_SO = dict(steps=3, width=12, depth=2, global_batch=24, lr=1e-2)
# every AdamW hyper-parameter away from its default: an optimizer that forwards only lr to its inner one is wrong
_SO_HYPER = dict(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)
WORLD_SIZES = (2, 3, 4)  # 3: code right only for even splits or powers of two fails


def _sharded_optimizer_harness(answer_cls, steps, width, depth, global_batch, lr, hyper=None, weigh=True):
    """Every rank: the answer's parameters after ``steps`` steps and (``weigh``) its bytes; rank 0 weighs AdamW's."""
    import copy

    import torch
    import torch.distributed as dist

    from ..lessons.memory import _problem
    rank, n = dist.get_rank(), dist.get_world_size()
    model, x, y = _problem(width, depth, global_batch, 0)  # seeded: the same weights on every rank
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    full_model = copy.deepcopy(model)  # the grader's own: AdamW over every parameter, weighed the same way
    hyper = dict(hyper or {})
    # smallest first: AdamW (one tensor at a time) keeps a tensor's denominator until the next one's replaces it,
    # so its scratch peaks at 2x one tensor + the one before; ascending order makes that the most any subset of
    # these parameters (any rank's shard, in any order) can need: the scratch an honest shard may allocate
    full_opt = torch.optim.AdamW(sorted(full_model.parameters(), key=lambda p: p.numel()), lr=lr, **hyper)
    weighed = _step_memory if weigh else (lambda fn: (fn(), (0, 0))[1])  # not weighed: (peak, kept) = (0, 0)
    box = {}
    build = weighed(lambda: box.update(opt=answer_cls(model.parameters(), torch.optim.AdamW, lr=lr, **hyper)))
    opt = box["opt"]
    b = global_batch // n
    peaks, kept = [], build[1]
    full_peak = full_kept = full_scratch = None
    for step in range(steps):
        torch.nn.functional.mse_loss(model(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
        for p in model.parameters():  # data parallelism (what DDP does): average the gradients
            dist.all_reduce(p.grad)
            p.grad /= n
        peak, left = weighed(opt.step)  # what this rank holds WHILE it steps
        peaks.append(kept + peak)
        kept += left
        opt.zero_grad()
        if step == 0:  # what zero_grad left behind (a gradient not cleared piles up into the next step)
            left_grads = [k for k, p in model.named_parameters() if p.grad is not None and bool(p.grad.any())]
            if weigh and rank == 0:  # the check reads the whole-AdamW reference's bytes from rank 0 only
                for p, q in zip(full_model.parameters(), model.parameters()):
                    p.grad = torch.ones_like(q)
                full_peak, full_kept = _step_memory(full_opt.step)  # the first step: builds the state
                full_scratch = _step_memory(full_opt.step)[0]         # a later one: AdamW's own scratch alone
    return dict(params={k: v.detach().clone() for k, v in model.state_dict().items()}, initial=initial,
                peak=max(peaks), kept=kept, full_peak=full_peak, full_kept=full_kept, full_scratch=full_scratch,
                left_grads=left_grads,
                numel=sum(p.numel() for p in model.parameters()))


def _sharded_reference(steps, width, depth, global_batch, lr, **hyper) -> dict:
    """One process, the whole batch, AdamW with ``hyper``: what the sharded optimizer must reproduce."""
    import torch

    from ..lessons.memory import _problem
    model, x, y = _problem(width, depth, global_batch, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, **hyper)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return dict(params={k: v.detach().clone() for k, v in model.state_dict().items()})


@exercise("sharded_optimizer")
def _check_sharded_optimizer(answer, grader):
    ref = _sharded_reference(**_SO)
    for world_size in WORLD_SIZES:
        outs = grader.run(world_size, _sharded_optimizer_harness, answer, *_SO.values())
        same = all(_close(o["params"][k], outs[0]["params"][k], rtol=0, atol=0) for o in outs for k in ref["params"])
        bad = [k for k in ref["params"] if not _close(outs[0]["params"][k], ref["params"][k], rtol=1e-5, atol=2e-6)]
        stale = [k for k in bad if _close(outs[0]["params"][k], outs[0]["initial"][k], rtol=0, atol=0)]
        differ = [(r, k) for r, o in enumerate(outs) for k in ref["params"]
                  if not _close(o["params"][k], outs[0]["params"][k], rtol=0, atol=0)]
        uncleared = [(r, o["left_grads"]) for r, o in enumerate(outs) if o["left_grads"]]
        if uncleared and (bad or not same):
            r, names = uncleared[0]
            hint = (f"after zero_grad(), rank {r} still holds the gradients of {len(names)} parameters "
                    f"({', '.join(names[:3])}): they add up into the next step. zero_grad must clear every "
                    "parameter's gradient (all of self.param_groups), not only the inner optimizer's")
        elif not same:
            r, k = differ[0]
            hint = (f"the ranks' parameters differ ({len(differ)} tensors, first {k!r} on rank {r} against rank 0): "
                    "after stepping its shard, each owner must send its updated parameters to every rank "
                    "(dist.broadcast(p.data, src=owner) for each parameter)")
        elif stale:
            hint = (f"{len(stale)} parameters never change on any rank ({', '.join(stale[:3])}): they were "
                    f"broadcast from a rank that did not update them. The src of each broadcast is that "
                    f"parameter's owner, not rank 0 - the same owner that stepped it, for any world size")
        elif not bad:
            hint = ""
        else:
            worst_k = max(bad, key=lambda k: max_error(outs[0]["params"][k], ref["params"][k]))
            hint = (f"{len(bad)} parameters differ from AdamW on one process (worst {worst_k!r}), though every "
                    "rank agrees and every parameter moved: look at what your step does beyond the inner "
                    "optimizer's step (the kwargs you pass it, zero_grad, a second step)")
        worst = max((max_error(outs[0]["params"][k], ref["params"][k]) for k in bad), default=0.0)
        yield Result(f"{world_size} ranks: equal to AdamW in one process (atol 2e-6, rtol 1e-5)", not bad and same,
                     hint, f"{len(bad)} tensors differ, max error {worst:.1e}" if bad else "")
        full_kept, full_peak, full_scratch = outs[0]["full_kept"], outs[0]["full_peak"], outs[0]["full_scratch"]
        kept = [o["kept"] for o in outs]
        peaks = [o["peak"] for o in outs]
        share = 1.5 / world_size
        held = max(kept) <= share * full_kept and sum(kept) <= 1.1 * full_kept
        yield Result(f"{world_size} ranks: each rank keeps optimizer state for its own shard only", held,
                     "build the inner optimizer over the parameters this rank owns, not all of them, and keep no "
                     "other per-parameter state of your own: that is the memory ZeRO-1 saves (each parameter's "
                     "Adam state lives on exactly one rank). Every allocation is weighed, torch's (profiler) and "
                     "NumPy's: state moved into NumPy arrays counts the same",
                     f"bytes kept after the steps per rank {kept}; AdamW over every parameter keeps {full_kept}")
        # while it steps a rank may hold its share of the state (the bound above) and the scratch AdamW itself
        # allocates for its tensors (measured on the whole model, smallest tensor first: the most any shard needs)
        allowed = share * full_kept + full_scratch
        during = max(peaks) <= allowed
        worst_rank = max(range(world_size), key=lambda r: peaks[r])
        yield Result(f"{world_size} ranks: no rank holds more than its shard while it steps (peak measured during "
                     "step)", during,
                     f"rank {worst_rank} held {peaks[worst_rank]:,} B at the peak of step(), "
                     f"{peaks[worst_rank] / full_peak:.2f}x what AdamW over every parameter needs at its peak "
                     f"({full_peak:,} B); its share of the state ({share * full_kept:,.0f} B) and AdamW's own "
                     f"scratch ({full_scratch:,} B) allow {allowed:,.0f} B: something full-sized is allocated during "
                     "step (a copy of every parameter or gradient, the whole state built and dropped)",
                     f"peak per rank {peaks}; allowed {allowed:,.0f} (share of the state {share * full_kept:,.0f} + "
                     f"AdamW's scratch {full_scratch:,})")
    # every hyper-parameter reaches the inner optimizer (family 4): an answer that forwards only lr steps with the
    # default betas, eps and weight decay, 8.5e-3 away after 3 steps (measured); summation order over 2-4 ranks
    # moved the solution by at most 7.7e-6
    outs = grader.run(2, _sharded_optimizer_harness, answer, *_SO.values(), _SO_HYPER, False)  # parameters only
    want = _sharded_reference(**_SO, **_SO_HYPER)["params"]
    off = max(max_error(outs[0]["params"][k], v) for k, v in want.items())
    yield Result(f"2 ranks, AdamW({', '.join(f'{k}={v}' for k, v in _SO_HYPER.items())}): every keyword reaches the "
                 "inner optimizer", off <= 2e-5,
                 "" if off <= 2e-5 else "pass every keyword you were given (**kwargs: betas, eps, weight_decay, ...) "
                 "to the inner optimizer, not only lr", f"max error {off:.1e}")


# ---- ZeRO-3: a Linear whose weight lives as row shards ----

_Z3 = dict(out_features=12, in_features=6, batch=12)  # divisible by 2, 3 and 4


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
    saved: dict = {}
    inputs = {xr.untyped_storage().data_ptr(), shard.untyped_storage().data_ptr()}

    def pack(t):  # every tensor autograd keeps for backward, in every node of the graph, behind any view
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs:  # each storage once, however many views of it are saved
            saved[storage.data_ptr()] = storage.nbytes() // max(1, t.element_size())
        return t

    box = {}
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            # bytes still allocated when forward returns, however they are held (saved, on ctx, in a global)
            left = _alive_after(lambda: box.update(y=answer(xr, shard)))
        y = box["y"]
        alive = (left - y.untyped_storage().nbytes()) // max(1, y.element_size())
        forward_counts = dict(counts)
        (y.pow(2).sum() / b).backward()  # this rank's mean; the mean over ranks is the global batch's mean
    finally:
        restore()
    return dict(y=y.detach(), grad_x=xr.grad, grad_shard=shard.grad, saved=list(saved.values()), counts=counts,
                forward_counts=forward_counts, alive=alive)


def _zero3_reference(world_size, out_features, in_features, batch):
    weight, x = _zero3_problem(world_size, out_features, in_features, batch)
    weight = weight.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    y = x @ weight.T
    (y.pow(2).sum() / batch).backward()
    return y.detach(), x.grad, weight.grad


@exercise("zero3_linear")
def _check_zero3_linear(answer, grader):
    for world_size in WORLD_SIZES:
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
    yield Result("the whole weight is freed after forward (not saved for backward, in any node of the graph)",
                 kept < full,
                 "autograd keeps a tensor of the whole weight's size for backward (measured with saved-tensor hooks "
                 "over the whole graph, so an op after the matmul - a view, a reshape - does not hide it): save "
                 "the input and the shard (ctx.save_for_backward(x, shard)), not the gathered weight, and do the "
                 "matmul inside your autograd.Function. Gather it again in backward",
                 f"largest saved tensor {kept} elements; the whole weight has {full}")
    # issue 33: the sum of what autograd saves besides the input and the shard, and every byte still allocated
    # when forward returns, however it is held (ctx.weight = ..., a global, pieces each smaller than the whole)
    total = max(sum(o["saved"]) for o in outs)
    yield Result("autograd saves nothing but the input and the shard (the sum of what it keeps, not the largest)",
                 total < full,
                 "besides x and the shard, autograd keeps tensors that add up to the whole weight in all (each "
                 "smaller than it, e.g. its pieces or a copy per row block): save only x and the shard, and gather "
                 "again in backward", f"{total} elements saved besides x and the shard; the whole weight has {full}")
    alive = max(o["alive"] for o in outs)
    yield Result("nothing of the gathered weight is alive after forward (every allocation weighed)", alive < full,
                 "forward leaves memory of the whole weight's size still alive after forward besides its output "
                 "(every tensor alive in the process and NumPy's arrays, however held: an attribute of ctx such as "
                 "ctx.weight = weight, a global, a cache). Keep only x and the shard (ctx.save_for_backward(x, "
                 "shard)) and let the gathered weight be freed when forward returns",
                 f"{alive} elements still allocated after forward besides the output; the whole weight has {full}")
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

# ``gates[i]``: extra element-wise gates in block i (h = h * sigmoid(h)): bytes kept for backward with almost no
# FLOPs, so bytes per FLOP differ from block to block and "fewest FLOPs" is not "largest blocks first"
_CK = dict(width=16, ffns=(64, 16, 48, 96, 32, 80), gates=(0, 5, 1, 0, 3, 0), batch=32)


def checkpoint_problem():
    """The exercise's model (residual blocks of different widths), its batch, and what each block costs.

    ``activation_bytes[i]``: bytes block i's forward leaves for backward (measured); ``input_bytes[i]``: what it
    keeps when checkpointed (its input); ``recompute_flops[i]``: its forward, done again in backward.
    """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width, ffn, gates):
            super().__init__()
            self.up, self.down, self.gates = nn.Linear(width, ffn), nn.Linear(ffn, width), gates

        def forward(self, x):
            h = torch.relu(self.up(x))
            for _ in range(self.gates):
                h = h * torch.sigmoid(h)
            return x + self.down(h)

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(_CK["width"], f, g) for f, g in zip(_CK["ffns"], _CK["gates"])])
    x = torch.randn(_CK["batch"], _CK["width"], requires_grad=True)
    per_block = []
    h = x
    for block in model:
        kept, h = kept_activation_bytes(block, h)
        per_block.append(kept)
    inputs = [x.numel() * x.element_size()] * len(model)
    # two matmuls (2 FLOPs per multiply-add each), a gate ~4 FLOPs per element (sigmoid, multiply)
    flops = [4 * _CK["batch"] * _CK["width"] * f + 4 * g * _CK["batch"] * f for f, g in zip(_CK["ffns"], _CK["gates"])]
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


def _best_set(acts, inputs, flops, budget):
    from itertools import combinations
    n = len(acts)
    fits = [s for k in range(n + 1) for s in combinations(range(n), k)
            if sum(inputs[i] if i in s else acts[i] for i in range(n)) <= budget]
    return min(fits, key=lambda s: (sum(flops[i] for i in s), s)) if fits else tuple(range(n))


def _exact(acts, inputs, flops, budget):
    """The bytes the optimum set for ``budget`` keeps: a budget it meets exactly."""
    s = _best_set(acts, inputs, flops, budget)
    return sum(inputs[i] if i in s else acts[i] for i in range(len(acts)))


@exercise("checkpoint_placement")
def _check_checkpoint_placement(answer, grader):
    _, _, acts, inputs, flops = checkpoint_problem()
    total, floor = sum(acts), sum(inputs)
    # budgets where greedy rules (largest blocks first, most bytes per FLOP first) and the optimum differ, and
    # budgets met exactly by the optimum (so "<" instead of "<=" shows)
    exact = [_exact(acts, inputs, flops, int(total * f)) for f in (0.8, 0.75, 0.6)]
    budgets = [total] + [b + 1 for b in exact] + exact + [int(total * 0.45), floor]
    answers = grader.ask(_chosen_harness, answer, [(acts, inputs, flops, b) for b in budgets], None,
                         what="your function")
    for budget, (_, chosen) in zip(budgets, answers):
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
        best_set = _best_set(acts, inputs, flops, budget)
        best_kept = sum(inputs[i] if i in best_set else acts[i] for i in range(len(acts)))
        if len(chosen) == len(acts):
            hint = ("checkpointing every block fits any budget, but recomputes the whole forward: checkpoint only "
                    "what the budget needs")
        elif best_kept == budget and kept < budget and cost == _best_cost(acts, inputs, flops, budget - 1):
            hint = (f"blocks {list(best_set)} keep exactly the budget ({budget:,} B) and recompute less: a set that "
                    "keeps exactly the budget fits (kept <= budget, not <)")
        else:
            hint = (f"blocks {list(best_set)} also fit and recompute {cost - best:,} fewer FLOPs: blocks differ in "
                    "bytes per FLOP, so neither the largest blocks first nor the best ratio first is optimal. Try "
                    "every subset (there are only 2^6), or think knapsack")
        yield Result(f"budget {budget:,} B: no more recomputation than needed", cost == best, hint,
                     f"your blocks recompute {cost:,} FLOPs; the least that fits is {best:,}")
        if cost != best:  # the first budget that shows the mistake names it; later ones would only guess
            return
    yield _checkpoint_fresh_problems(answer, grader)


def _chosen_harness(answer, problems, limit):
    """In a worker (the answer runs there, never in the grading process): the blocks the answer chooses for each
    problem, as ("ok", sorted ints). ``limit``: each call is refused if it calls the grader and stopped after
    ``limit`` s, and the first that fails ends the list with ("used" | "timeout" | "error", why); else it raises."""
    from . import core
    from ..plain import exact_str
    out, old = [], core.ANSWER_CALL_LIMIT
    core.ANSWER_CALL_LIMIT = limit or old
    try:
        for acts, inputs, flops, budget in problems:
            try:
                got = (answer(list(acts), list(inputs), list(flops), budget) if limit is None else
                       refuse_grader_calls(answer, list(acts), list(inputs), list(flops), budget))
                out.append(("ok", sorted(set(int.__int__(int(i)) for i in got))))
            except Exception as exc:  # noqa: BLE001 - the learner's code on a new problem
                if limit is None:
                    raise
                kind = {UsedTheGrader: "used", AnswerTimeout: "timeout"}.get(type(exc), "error")
                out.append((kind, exact_str(exc) if kind != "error" else f"{type(exc).__name__}: {exact_str(exc)}"))
                break
    finally:
        core.ANSWER_CALL_LIMIT = old
    return out


def _checkpoint_fresh_problems(answer, grader, count: int = 40):
    """Problems drawn now from a grader-private source (``secrets``: no answer can rebuild them), 1 to 8 blocks,
    any budget between the floor and the total: an answer right only on the lesson's model (a hard-coded set, a
    range that misses the last block or the largest subsets) fails here. The seed is shown to reproduce it."""
    import random
    import secrets
    from . import core
    seed = secrets.randbits(32)
    draw = random.Random(seed)
    problems = []
    for case in range(count):
        n = 1 + case % 8
        acts = [draw.randint(10, 4000) for _ in range(n)]
        inputs = [draw.randint(1, a) for a in acts]
        problems.append((acts, inputs, [draw.randint(1, 5000) for _ in range(n)],
                         draw.randint(sum(inputs), sum(acts))))
    answers = grader.ask(_chosen_harness, answer, problems, core.ANSWER_CALL_LIMIT, what="your function")
    for (acts, inputs, flops, budget), (kind, chosen) in zip(problems, answers):
        n = len(acts)
        what = f"{n} blocks, activation_bytes={acts}, input_bytes={inputs}, recompute_flops={flops}, budget={budget}"
        if kind == "used":
            return Result("40 fresh random problems: your own solver", False,
                          "solve the problem with your own code: calling the grader's reference is not an answer",
                          chosen)
        if kind == "timeout":
            return Result("40 fresh random problems: least recomputation that fits", False, "with n blocks there "
                          "are 2^n subsets (256 for 8): an exhaustive search ends in milliseconds; look for a loop "
                          "that never ends on some problems", f"{chosen} on {what} (seed {seed})", status="timeout")
        if kind != "ok":
            return Result("40 fresh random problems: least recomputation that fits", False,
                          "your function raised on a problem other than the lesson's: it must work for any number "
                          "of blocks and any budget", f"{chosen} on {what} (seed {seed})")
        kept = sum(inputs[i] if i in chosen else acts[i] for i in range(n)) if all(
            0 <= i < n for i in chosen) else None
        cost, best = sum(flops[i] for i in chosen if 0 <= i < n), _best_cost(acts, inputs, flops, budget)
        if kept is None or kept > budget or cost != best:
            got = "invalid indices" if kept is None else f"kept {kept:,} B, recompute {cost:,}"
            return Result("40 fresh random problems: least recomputation that fits", False,
                          "right on the lesson's model but not on another: consider every block (indices 0 .. n-1) "
                          "and every subset size from 0 to n, with kept = activation_bytes of the others + "
                          "input_bytes of the checkpointed ones <= budget",
                          f"{what}: you chose {chosen} ({got}); the optimum recomputes {best:,} (seed {seed})")
    return Result("40 fresh random problems: least recomputation that fits", True, detail=f"seed {seed}")
