"""Check for lesson 07's ZeRO-3 Linear (gather, free, reduce-scatter), on problems drawn at check time: sizes, the
dtype (float32 and float64: a gathered buffer in the default dtype is wrong for a float64 layer), 2 to 4 ranks."""

from __future__ import annotations

from .core import Result, _close, exercise, max_error
from .weighing import _alive_after

Z3_WORLDS = (2, 3, 4)  # not 5: a fifth cluster's start (over-subscribed on 2 cores) costs over +30 % of the check


def z3_problem(world_size: int):
    """A Hypothesis strategy of one ZeRO-3 Linear problem on ``world_size`` ranks: 1 to 4 rows of W per rank, odd
    and even input widths, 1 to 3 samples per rank, float32 or float64 (a gathered buffer allocated in the default
    dtype is wrong for a float64 layer), a secret seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            out_features=st.integers(1, 4).map(lambda k: k * world_size),
            in_features=st.integers(1, 9),
            batch=st.integers(1, 3).map(lambda b: b * world_size),
            dtype=st.sampled_from(("float32", "float64")),
            seed=st.integers(0, 2**62),
        )
    )


def _z3_problems() -> dict:
    """{world size: problem}, drawn now from the OS's randomness; float64 on 2 ranks, float32 on 3."""
    from hypothesis import strategies as st

    from .instances import draw

    drawn = list(draw(st.tuples(*(z3_problem(w) for w in Z3_WORLDS)), 1)[0])
    drawn[0], drawn[1] = dict(drawn[0], dtype="float64"), dict(drawn[1], dtype="float32")  # both dtypes, always
    return dict(zip(Z3_WORLDS, drawn))


def _z3_size(p: dict) -> str:
    return f"W {p['out_features']}x{p['in_features']}, batch {p['batch']}, {p['dtype']}"


def _z3_close(actual, expected, dtype: str) -> bool:
    """Equal within the precision of ``dtype``: float64 values rounded through float32 (about 1e-8 relative) fail."""
    import torch

    if actual is None or torch.as_tensor(actual).dtype != getattr(torch, dtype):
        return False
    if dtype == "float32":  # sums of products in float32: an entry near 0 after cancellation carries the rounding of
        # its summands (seen in CI: F.linear against x @ W.T off by more than 1e-6 there), so the absolute
        # tolerance is relative to the largest value; a wrong gradient is off by far more
        scale = float(torch.as_tensor(expected).abs().max()) if torch.as_tensor(expected).numel() else 0.0
        return _close(actual, expected, rtol=1e-4, atol=1e-5 * (1.0 + scale))
    return _close(actual, expected, rtol=1e-10, atol=1e-12)


def _kinds(names) -> dict:
    """{collective: calls} from the grader's record at the dispatcher (every name and alias: an all-gather is an
    all-gather whether called as dist.all_gather_into_tensor or through distributed_c10d)."""
    counts: dict = {}
    for name in names:
        kind = next((k for k in ("all_gather", "reduce_scatter") if name.startswith(k)), name)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _zero3_problem(out_features, in_features, batch, dtype, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g, dtype=getattr(torch, dtype))
    x = torch.randn(batch, in_features, generator=g, dtype=getattr(torch, dtype))
    return weight, x


def _zero3_harness(answer, problem):
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    batch = problem["batch"]
    weight, x = _zero3_problem(**problem)
    b = batch // n
    xr = x[rank * b : (rank + 1) * b].clone().requires_grad_(True)
    shard = weight.chunk(n)[rank].clone().requires_grad_(True)
    from .contracts import recorder

    saved: dict = {}
    inputs = {xr.untyped_storage().data_ptr(), shard.untyped_storage().data_ptr()}

    def pack(t):  # every tensor autograd keeps for backward, in every node of the graph, behind any view
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs:  # each storage once, however many views of it are saved
            saved[storage.data_ptr()] = storage.nbytes() // max(1, t.element_size())
        return t

    box = {}
    with recorder() as forward, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        # bytes still allocated when forward returns, however they are held (saved, on ctx, in a global)
        left = _alive_after(lambda: box.update(y=answer(xr, shard)))
    y = box["y"]
    alive = (left - y.untyped_storage().nbytes()) // max(1, y.element_size())
    with recorder() as backward:  # the grader's, at the dispatcher: collectives under any name
        (y.pow(2).sum() / b).backward()  # this rank's mean; the mean over ranks is the global batch's mean
    forward_counts, counts = _kinds(forward.collectives), _kinds(forward.collectives + backward.collectives)
    return dict(
        y=y.detach(),
        grad_x=xr.grad,
        grad_shard=shard.grad,
        saved=list(saved.values()),
        counts=counts,
        forward_counts=forward_counts,
        alive=alive,
    )


def _zero3_reference(problem):
    weight, x = _zero3_problem(**problem)
    weight = weight.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    y = x @ weight.T
    (y.pow(2).sum() / problem["batch"]).backward()
    return y.detach(), x.grad, weight.grad


def _z3_wrong(answer, grader, world_size, problem) -> bool:
    """One run of ``problem``: is the output or a gradient off (to the dtype's precision) on some rank?"""
    outs = grader.run(world_size, _zero3_harness, answer, problem)
    y, gx, gw = _zero3_reference(problem)
    b, rows, dtype = problem["batch"] // world_size, problem["out_features"] // world_size, problem["dtype"]
    return not all(
        _z3_close(o["y"], y[r * b : (r + 1) * b], dtype)
        and _z3_close(o["grad_x"], world_size * gx[r * b : (r + 1) * b], dtype)
        and _z3_close(o["grad_shard"], gw[r * rows : (r + 1) * rows], dtype)
        for r, o in enumerate(outs)
    )


def _z3_smallest(answer, grader, world_size, problem, told: list) -> str:
    """The smallest failing problem Hypothesis finds on ``world_size`` ranks (6 runs at most), once per check
    (``told``); nothing for the tests of planted answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if told or grader.first_failure:
        return ""
    told.append(1)

    def fails(p) -> bool:
        try:
            return _z3_wrong(answer, grader, world_size, p)
        except _Stop:
            return True

    p = smallest(z3_problem(world_size), fails, budget=6, first=problem)
    return f"; smallest failing case found: {world_size} ranks, {_z3_size(p)}"


def _z3_wide(problem: dict, world_size: int) -> dict:
    """The problem made wide enough that the weight, not the messages' headers, fills the wire."""
    return {**problem, "out_features": 4 * world_size, "in_features": 2048 + problem["in_features"]}


def _z3_wire_harness(answer, problem):
    """Forward and backward of the layer once, for the kernel's counters: the answer's, or (``answer`` None) the
    exercise's collectives as the course runs them (:mod:`simlib.parallel.zero`'s all-gather and reduce-scatter of
    shards: one all-gather in forward, one all-gather and one reduce-scatter in backward), which also says the bytes
    they carry from this rank by Gloo's algorithms (an all-gather sends the shard to each other rank; Gloo runs a
    reduce-scatter as an all-reduce of its input: 2(n-1)/n of it)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    weight, x = _zero3_problem(**problem)
    b = problem["batch"] // n
    xr = x[rank * b : (rank + 1) * b].clone().requires_grad_(True)
    shard = weight.chunk(n)[rank].clone().requires_grad_(True)
    if answer is not None:
        (answer(xr, shard).pow(2).sum() / b).backward()
        return {}
    from ..parallel.zero import all_gather_shards, reduce_scatter_shards

    with torch.no_grad():
        full = torch.empty_like(weight)
        all_gather_shards(full, shard.detach())  # forward
        grad_y = 2 * (xr @ full.T) / b
        all_gather_shards(full, shard.detach())  # backward: gathered again
        grad_shard = torch.empty_like(shard)
        reduce_scatter_shards(grad_shard, (grad_y.T @ xr).contiguous())
    size = weight.element_size()
    return dict(payload=2 * (n - 1) * shard.numel() * size + round(2 * (n - 1) / n * weight.numel() * size))


def _z3_wire(answer, grader, problem, world_size) -> Result:
    """What each rank sent on the wide copy of ``problem``, against what the exercise's collectives send there
    (:func:`simlib.grading.wire.beyond`)."""
    from .wire import beyond, per_rank

    wide = _z3_wide(problem, world_size)
    name = f"{world_size} ranks, W {wide['out_features']}x{wide['in_features']}: on the wire two gathers of the shards and one reduce-scatter"
    refs = grader.run(world_size, _z3_wire_harness, None, wide, what="the course's ZeRO-3 collectives", wire=True)
    reference = grader.wire_last
    if reference is not None:
        grader.run(
            world_size, _z3_wire_harness, answer, wide, what=f"your ZeRO-3 Linear on {world_size} ranks", wire=True
        )
    if reference is None or grader.wire_last is None:
        return Result(name + " (skipped: the kernel's counters cannot be read here)", True)
    breach = beyond(
        per_rank(grader.wire_last, world_size),
        per_rank(reference, world_size),
        [o["payload"] for o in refs],
        "two all-gathers of its shard and one reduce-scatter of the weight's gradient",
    )
    return Result(
        name + " (the kernel's counters)",
        not breach,
        "ZeRO-3 moves each shard to the other ranks once per use (an all-gather in forward, one in backward) and the "
        "weight's gradient once (a reduce-scatter): no third gather, no all-gather or broadcast of the whole "
        "gradient, no all-reduce of the whole weight",
        breach,
    )


@exercise("zero3_linear")
def _check_zero3_linear(answer, grader):
    problems, told = _z3_problems(), []  # drawn now, in this process, from the OS's randomness
    for world_size in Z3_WORLDS:
        problem = problems[world_size]
        dtype = problem["dtype"]
        size = _z3_size(problem)
        outs = grader.run(world_size, _zero3_harness, answer, problem)
        y, gx, gw = _zero3_reference(problem)
        b = problem["batch"] // world_size
        rows = problem["out_features"] // world_size
        y_ok = all(_z3_close(o["y"], y[r * b : (r + 1) * b], dtype) for r, o in enumerate(outs))
        y_hint = "all-gather the shards (rank r holds rows r*out/N .. (r+1)*out/N) into the whole W, in rank order"
        if not y_ok and all(_close(o["y"], y[r * b : (r + 1) * b]) for r, o in enumerate(outs)):
            y_hint = (
                f"right to float32's precision only, on a {dtype} layer (output dtype "
                f"{str(outs[0]['y'].dtype).replace('torch.', '')}): allocate the gathered weight in the shard's "
                "dtype (torch.empty(..., dtype=weight_shard.dtype)), not the default float32"
            )
        yield Result(
            f"{world_size} ranks ({size}): forward equals x @ W.T with the whole weight",
            y_ok,
            y_hint + ("" if y_ok else _z3_smallest(answer, grader, world_size, problem, told)),
            ""
            if y_ok
            else "max error %.2g" % max(max_error(o["y"], y[r * b : (r + 1) * b]) for r, o in enumerate(outs)),
        )
        if not y_ok:
            return
        # each rank's loss is the mean over its b samples: its input gradient is N times the global batch's
        gx_ok = all(_z3_close(o["grad_x"], world_size * gx[r * b : (r + 1) * b], dtype) for r, o in enumerate(outs))
        yield Result(
            f"{world_size} ranks ({size}): gradient of the input",
            gx_ok,
            "grad_x = grad_y @ W with the WHOLE weight, in the layer's dtype: gather it again in backward"
            + ("" if gx_ok else _z3_smallest(answer, grader, world_size, problem, told)),
        )
        got = [o["grad_shard"] for o in outs]
        want = [gw[r * rows : (r + 1) * rows] for r in range(world_size)]
        ok = all(_z3_close(g, w, dtype) for g, w in zip(got, want))
        if ok:
            hint = ""
        elif all(g is not None and _close(g, w * world_size) for g, w in zip(got, want)):
            hint = (
                f"your shard's gradient is {world_size}x too large: reduce-scatter SUMS the ranks' gradients; "
                "divide by the world size to average them, as data parallelism does"
            )
        elif all(g is not None and _close(g, w) for g, w in zip(reversed(got), want)) or any(
            g is not None and any(_close(g, w) for w in want if w is not want[r]) for r, g in enumerate(got)
        ):
            hint = "a rank got another rank's rows: rank r's shard is chunk r of the full gradient (in rank order)"
        else:
            hint = (
                "grad_W = grad_y.T @ x on each rank, then reduce-scatter it (sum over ranks, each rank keeps its "
                "own rows) and divide by the world size"
            )
        hint += "" if ok else _z3_smallest(answer, grader, world_size, problem, told)
        yield Result(
            f"{world_size} ranks ({size}): each rank's shard gets its rows of the averaged weight gradient", ok, hint
        )
        if ok:  # bytes below every Python name: the kernel's counters
            yield _z3_wire(answer, grader, problem, world_size)
    full = problem["out_features"] * problem["in_features"]
    kept = max((max(o["saved"], default=0) for o in outs), default=0)
    yield Result(
        "the whole weight is freed after forward (not saved for backward, in any node of the graph)",
        kept < full,
        "autograd keeps a tensor of the whole weight's size for backward (measured with saved-tensor hooks "
        "over the whole graph, so an op after the matmul - a view, a reshape - does not hide it): save "
        "the input and the shard (ctx.save_for_backward(x, shard)), not the gathered weight, and do the "
        "matmul inside your autograd.Function. Gather it again in backward",
        f"largest saved tensor {kept} elements; the whole weight has {full}",
    )
    # issue 33: the sum of what autograd saves besides the input and the shard, and every byte still allocated
    # when forward returns, however it is held (ctx.weight = ..., a global, pieces each smaller than the whole)
    total = max(sum(o["saved"]) for o in outs)
    yield Result(
        "autograd saves nothing but the input and the shard (the sum of what it keeps, not the largest)",
        total < full,
        "besides x and the shard, autograd keeps tensors that add up to the whole weight in all (each "
        "smaller than it, e.g. its pieces or a copy per row block): save only x and the shard, and gather "
        "again in backward",
        f"{total} elements saved besides x and the shard; the whole weight has {full}",
    )
    alive = max(o["alive"] for o in outs)
    yield Result(
        "nothing of the gathered weight is alive after forward (every allocation weighed)",
        alive < full,
        "forward leaves memory of the whole weight's size still alive after forward besides its output "
        "(every tensor alive in the process and NumPy's arrays, however held: an attribute of ctx such as "
        "ctx.weight = weight, a global, a cache). Keep only x and the shard (ctx.save_for_backward(x, "
        "shard)) and let the gathered weight be freed when forward returns",
        f"{alive} elements still allocated after forward besides the output; the whole weight has {full}",
    )
    counts, fwd = outs[0]["counts"], outs[0]["forward_counts"]
    want_counts = {"all_gather": 2, "reduce_scatter": 1}
    if counts == want_counts and fwd == {"all_gather": 1}:
        hint = ""
    elif counts.get("all_reduce"):
        hint = (
            "an all-reduce gives every rank the whole gradient and moves twice the bytes: a reduce-scatter "
            "gives each rank just its rows"
        )
    elif counts.get("all_gather", 0) < 2:
        hint = "gather the weight once in forward and once again in backward (it was freed in between)"
    else:
        hint = "one all-gather in forward, one all-gather and one reduce-scatter in backward"
    yield Result(
        "communication: all-gather in forward; all-gather and reduce-scatter in backward",
        not hint,
        hint,
        f"forward {fwd}, in all {counts}",
    )
