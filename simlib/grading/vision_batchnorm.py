"""Checks for the vision project's first learner piece, SyncBatchNorm's autograd Function (``sync_batchnorm``;
``solutions/11_vision_pieces.ipynb``), run in the grader's workers on instances drawn at check time (:mod:`.instances`).

The answer runs inside the course's own :class:`simlib.parallel.batchnorm.SyncBatchNorm` layer (where it runs in
training), on 2, 3 and 4 ranks with *unequal* per-rank batches whose means differ from rank to rank (averaging
per-rank means or variances is then wrong), drawn channels, image sizes, eps and momentum, and values far from zero
beside their spread (mean 1000-4000, std about 1: ``Σx²/n − mean²`` in float32 loses the variance). Against
``nn.BatchNorm2d`` in float64 on the global batch: outputs, input gradients, the weight and bias gradients (each
rank's share: the data-parallel wrapper sums or averages them, so their sum over ranks must be the global batch's),
the running statistics after two steps and the output in eval mode; and the collectives the answer made, recorded at
torch's dispatcher: statistics (a few numbers per channel), never the samples. The data shard is :mod:`.vision_shard`.
"""

from __future__ import annotations

from .core import Result, exercise

_BN_WORLDS = (2, 3, 4)


def bn_case(world_size: int, kind: str):
    """A Hypothesis strategy of one SyncBatchNorm instance of ``kind`` ("uneven", "large", "wide") on ``world_size``
    ranks: per-rank batch sizes (never all equal), channels, image size, eps, momentum, rank offsets, a seed."""
    from hypothesis import strategies as st

    lo, hi = (6, 10) if kind == "wide" else (1, 6)
    sizes = st.lists(st.integers(lo, hi), min_size=world_size, max_size=world_size).filter(lambda s: len(set(s)) > 1)
    side = st.just(4) if kind == "wide" else st.integers(1, 4)
    return st.fixed_dictionaries(
        dict(
            kind=st.just(kind),
            sizes=sizes,
            channels=st.integers(2, 6) if kind == "wide" else st.integers(1, 6),
            hw=st.tuples(side, side),
            eps=st.sampled_from((1e-5, 1e-3, 1e-2)),
            momentum=st.sampled_from((0.05, 0.1, 0.3, 0.5)),
            center=st.floats(1000.0, 4000.0) if kind == "large" else st.floats(-1.0, 1.0),
            spread=st.floats(0.5, 2.0),  # how far apart the ranks' means are (in units of the samples' std)
            seed=st.integers(0, 2**62),
        )
    )


def _bn_cases() -> dict:
    from hypothesis import strategies as st

    from .instances import draw

    kinds = ("uneven", "large", "wide")
    strategy = st.tuples(*(st.tuples(*(bn_case(w, k) for k in kinds)) for w in _BN_WORLDS))
    drawn = draw(strategy, 1)[0]
    return {w: [dict(c) for c in drawn[i]] for i, w in enumerate(_BN_WORLDS)}


_BN_STEPS = 2


def _bn_data(case, world_size):
    """The instance's tensors, the same on every rank: per step the global batch and the upstream gradient, the
    layer's weight and bias, and an eval batch."""
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    c, (h, w), sizes = case["channels"], case["hw"], case["sizes"]
    owner = torch.repeat_interleave(torch.arange(world_size), torch.tensor(sizes))
    means = case["center"] + case["spread"] * torch.randn(world_size, c, generator=g, dtype=torch.float64)
    steps = []
    for _ in range(_BN_STEPS):
        x = torch.randn(len(owner), c, h, w, generator=g, dtype=torch.float64) + means[owner].view(-1, c, 1, 1)
        steps.append((x.float(), torch.randn(len(owner), c, h, w, generator=g)))
    weight, bias = 1 + 0.5 * torch.randn(c, generator=g), torch.randn(c, generator=g)
    x_eval = (torch.randn(3, c, h, w, generator=g, dtype=torch.float64) + means[0].view(1, c, 1, 1)).float()
    return steps, weight, bias, x_eval


def _bn_reference(case, world_size):
    """``nn.BatchNorm2d`` in float64 on the global batch: per step (y, input grad, weight grad, bias grad), then the
    running statistics and the eval output; and, for the hints, the output of the usual wrong statistics."""
    import torch
    from torch import nn

    steps, weight, bias, x_eval = _bn_data(case, world_size)
    bn = nn.BatchNorm2d(case["channels"], eps=case["eps"], momentum=case["momentum"]).double()
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    per_step = []
    for x, gy in steps:
        xd = x.double().requires_grad_()
        y = bn(xd)
        (y * gy.double()).sum().backward()
        per_step.append(dict(y=y.detach(), gx=xd.grad, gw=bn.weight.grad.clone(), gb=bn.bias.grad.clone()))
        bn.weight.grad = bn.bias.grad = None
    bn.eval()
    with torch.no_grad():
        y_eval = bn(x_eval.double())
    return dict(steps=per_step, running_mean=bn.running_mean, running_var=bn.running_var, y_eval=y_eval)


def _bn_wrong_outputs(case, world_size):
    """Step 0's output under the statistics people get wrong: {name: y of the global batch}."""
    import torch

    steps, weight, bias, _ = _bn_data(case, world_size)
    x = steps[0][0].double()
    sizes, eps = case["sizes"], case["eps"]
    parts = torch.split(x, sizes)
    shape = (1, -1, 1, 1)

    def norm(xs, mean, var):
        return (xs - mean.view(shape)) / torch.sqrt(var.view(shape) + eps) * weight.double().view(
            shape
        ) + bias.double().view(shape)

    dims = (0, 2, 3)
    local = torch.cat([norm(p, p.mean(dims), p.var(dims, unbiased=False)) for p in parts])
    avg_mean = torch.stack([p.mean(dims) for p in parts]).mean(0)
    avg_var = torch.stack([p.var(dims, unbiased=False) for p in parts]).mean(0)
    averaged = norm(x, avg_mean, avg_var)
    n = x.numel() // x.shape[1]
    unbiased = norm(x, x.mean(dims), x.var(dims, unbiased=False) * n / max(n - 1, 1))
    return dict(local=local, averaged=averaged, unbiased=unbiased)


def _bn_harness(answer, cases):
    """The answer inside the course's SyncBatchNorm layer on this rank's (unequal) part of each case's batches."""
    import torch
    import torch.distributed as dist

    from .. import pieces
    from ..parallel.batchnorm import SyncBatchNorm
    from .contracts import recorder

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for case in cases:
        steps, weight, bias, x_eval = _bn_data(case, world)
        lo = sum(case["sizes"][:rank])
        hi = lo + case["sizes"][rank]
        layer = SyncBatchNorm(case["channels"], eps=case["eps"], momentum=case["momentum"])
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        per_step = []
        with pieces.using({"sync_batchnorm": answer}):
            for x, gy in steps:
                xs = x[lo:hi].clone().requires_grad_()
                with recorder() as rec:
                    y = layer(xs)
                    (y * gy[lo:hi]).sum().backward()
                per_step.append(
                    dict(
                        y=y.detach().clone(),
                        gx=None if xs.grad is None else xs.grad.clone(),
                        gw=None if layer.weight.grad is None else layer.weight.grad.clone(),
                        gb=None if layer.bias.grad is None else layer.bias.grad.clone(),
                        calls=[(c["op"], int(c["elements"])) for c in rec.calls],
                    )
                )
                layer.weight.grad = layer.bias.grad = None
        layer.eval()
        with torch.no_grad():
            y_eval = layer(x_eval)
        out.append(
            dict(
                steps=per_step,
                running_mean=layer.running_mean.clone(),
                running_var=layer.running_var.clone(),
                y_eval=y_eval,
            )
        )
    return out


def _close_to(got, want, large: bool) -> bool:
    import torch

    if got is None or tuple(got.shape) != tuple(want.shape) or not torch.isfinite(got).all():
        return False
    tol = 2e-3 if large else 2e-4  # float32 values near 4000 hold about 4e-4 of rounding; torch's own BN: 2e-4
    return bool(((got.double() - want).abs() <= tol * (1 + want.abs())).all())


def _describe_bn(world, case) -> str:
    h, w = case["hw"]
    far = f", values near {case['center']:.0f} (std about 1)" if case["kind"] == "large" else ""
    return (
        f"{world} ranks with {case['sizes']} samples, {case['channels']} channels, {h}x{w} images, "
        f"eps {case['eps']:g}, momentum {case['momentum']:g}{far}"
    )


def _bn_verdicts(runs) -> dict:
    """{check: [(world, case, passed), ...]} from the runs and the references."""
    import torch

    table = {k: [] for k in ("forward", "input_grad", "param_grad", "running", "eval", "comm")}
    for world, cases, per_rank, refs in runs:
        for i, case in enumerate(cases):
            large = case["kind"] == "large"
            ref = refs[i]
            offs = [sum(case["sizes"][:r]) for r in range(world)] + [sum(case["sizes"])]
            ranks = [per_rank[r][i] for r in range(world)]

            def each(key, step):
                return all(
                    _close_to(ranks[r]["steps"][step][key], ref["steps"][step][key][offs[r] : offs[r + 1]], large)
                    for r in range(world)
                )

            def summed(key, step):
                got = [ranks[r]["steps"][step][key] for r in range(world)]
                if any(g is None or tuple(g.shape) != (case["channels"],) for g in got):
                    return False
                return _close_to(torch.stack(got).sum(0), ref["steps"][step][key], large)

            table["forward"].append((world, case, all(each("y", s) for s in range(_BN_STEPS))))
            table["input_grad"].append((world, case, all(each("gx", s) for s in range(_BN_STEPS))))
            table["param_grad"].append(
                (world, case, all(summed("gw", s) and summed("gb", s) for s in range(_BN_STEPS)))
            )
            run_ok = all(
                _close_to(ranks[r]["running_mean"], ref["running_mean"], large)
                and _close_to(ranks[r]["running_var"], ref["running_var"], large)
                for r in range(world)
            )
            table["running"].append((world, case, run_ok))
            table["eval"].append(
                (world, case, all(_close_to(ranks[r]["y_eval"], ref["y_eval"], large) for r in range(world)))
            )
            if case["kind"] == "wide":  # statistics are a few numbers per channel; the samples are many more
                c = case["channels"]
                bound = 4 * world * (c + 1) + 16
                moved = [sum(e for _, e in ranks[r]["steps"][0]["calls"]) for r in range(world)]
                calls = [len(ranks[r]["steps"][0]["calls"]) for r in range(world)]
                table["comm"].append((world, case, max(moved) <= bound and 1 <= min(calls) and max(calls) <= 8))
    return table


def _bn_hint(check, failed, runs) -> str:
    """What the first failing instance says about the mistake."""
    import torch

    world, case = failed
    where = f". Smallest failing instance drawn: {_describe_bn(world, case)}."
    refs, per_rank = next((r[3], r[2]) for r in runs if r[0] == world)
    i = next(j for j, c in enumerate(next(r[1] for r in runs if r[0] == world)) if c is case)
    ranks = [per_rank[r][i] for r in range(world)]
    if check == "forward":
        y = torch.cat([ranks[r]["steps"][0]["y"].double() for r in range(world)])
        wrong = _bn_wrong_outputs(case, world)
        if case["kind"] == "large" and not any(
            _close_to(y, w_, False) for w_ in wrong.values()
        ):  # right elsewhere, wrong far from zero
            return (
                "far from zero the variance Σx²/n − mean² subtracts two nearly equal numbers: in float32 most of its "
                "digits are lost (mean 3000: Σx²/n ≈ 9·10⁶, float32 keeps about 7 digits). Sum x and x² in float64 "
                "(x.double()), or all-reduce the mean first and then Σ(x − mean)²" + where
            )
        if y.shape == wrong["local"].shape and _close_to(y, wrong["local"], False):
            return (
                "each rank normalised with its own samples' statistics: all-reduce the per-channel Σx, Σx² and the "
                "count over the group (dist.all_reduce(..., group=group)) and take the mean and variance from those"
                + where
            )
        if y.shape == wrong["averaged"].shape and _close_to(y, wrong["averaged"], False):
            return (
                "you averaged the ranks' means and variances: with unequal batches a rank's mean weighs by its count, "
                "and the variance also has the spread between the ranks' means. All-reduce the sums Σx, Σx² and the "
                "count n, then mean = Σx/n and var = Σx²/n − mean²" + where
            )
        if y.shape == wrong["unbiased"].shape and _close_to(y, wrong["unbiased"], False):
            return (
                "BatchNorm normalises with the biased variance (divide by n, not n − 1); the unbiased one goes only "
                "into running_var" + where
            )
        return (
            "y must be (x − mean)/sqrt(var + eps)·weight + bias with the global batch's per-channel mean and biased "
            "variance (over N, H and W of every rank), and eps the argument given" + where
        )
    if check == "input_grad":
        return (
            "the input gradient goes through the shared statistics: all-reduce Σ∂y and Σ∂y·x̂ per channel, then "
            "∂x = weight/sqrt(var+eps)·(∂y − Σ∂y/n − x̂·Σ∂y·x̂/n) with n the global count; local sums give a "
            "different gradient" + where
        )
    if check == "param_grad":
        gw = (
            torch.stack([ranks[r]["steps"][0]["gw"] for r in range(world)])
            if all(ranks[r]["steps"][0]["gw"] is not None for r in range(world))
            else None
        )
        if gw is not None and world > 1 and torch.allclose(gw[0], gw[-1]) and case["sizes"][0] != case["sizes"][-1]:
            return (
                "every rank returned the same weight/bias gradient: did you all-reduce them? Return this rank's own "
                "Σ∂y·x̂ and Σ∂y; the data-parallel wrapper reduces parameter gradients once for the whole model" + where
            )
        return "the weight gradient is Σ∂y·x̂ and the bias gradient Σ∂y over this rank's samples" + where
    if check == "running":
        return (
            "the layer updates running_mean/var from the (mean, var, count) your apply returns: the global mean, "
            "the biased variance and the global count per channel (all ranks' samples × H × W)" + where
        )
    if check == "eval":
        return "in eval mode the layer uses the running statistics, which your (mean, var, count) feed" + where
    return (
        "forward and backward should each all-reduce a few numbers per channel (sums and a count), not gather the "
        "samples: at most 8 collectives per step moving O(channels × world size) elements" + where
    )


@exercise("sync_batchnorm")
def _check_sync_batchnorm(answer, grader):
    cases = _bn_cases()
    runs = []
    for world in _BN_WORLDS:
        per_rank = grader.run(world, _bn_harness, answer, cases[world])
        runs.append((world, cases[world], per_rank, [_bn_reference(c, world) for c in cases[world]]))
    table = _bn_verdicts(runs)
    names = {
        "forward": "forward: every rank's output equals BatchNorm on the global batch (2, 3 and 4 ranks, unequal "
        "batches)",
        "input_grad": "backward: the input gradients equal BatchNorm's on the global batch",
        "param_grad": "weight and bias gradients: each rank's own share (their sum is the global batch's)",
        "running": "running mean and variance after two steps equal BatchNorm's",
        "eval": "eval mode: the output from the running statistics equals BatchNorm's",
        "comm": "communication: a few all-reduced numbers per channel, not the samples",
    }
    large_ok = all(ok for _, case, ok in table["forward"] if case["kind"] == "large")
    forward_wrong = {id(c) for _, c, ok in table["forward"] if not ok}
    for key, rows in table.items():
        failing = [(w, c) for w, c, ok in rows if not ok]
        if failing:
            failing.sort(key=lambda wc: (wc[1]["kind"] == "large", sum(wc[1]["sizes"]), wc[1]["channels"], wc[0]))
            own = [wc for wc in failing if id(wc[1]) not in forward_wrong]  # wrong here although the forward is right
            hint = (
                _bn_hint(key, (failing if key == "forward" else own)[0], runs)
                if key == "forward" or own
                else "this follows from the forward's statistics (above): make the forward right first"
            )
            yield Result(names[key], False, hint=hint, detail=f"{len(failing)} of {len(rows)} instances")
        else:
            yield Result(names[key], True, detail=f"{len(rows)} instances")
    yield Result(
        "values far from zero (mean 1000-4000, std about 1): the variance keeps its digits",
        large_ok,
        hint=""
        if large_ok
        else _bn_hint(
            "forward", next((w, c) for w, c, ok in table["forward"] if not ok and c["kind"] == "large"), runs
        ),
    )
