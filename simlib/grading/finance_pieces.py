"""Checks of the finance project's two learner pieces (``simlib/projects/finance/pieces.py``; the slots of its
``run.py``): ``finance_paths`` (each rank's Monte-Carlo paths) and ``finance_grad_average`` (the count-weighted
gradient and loss average).

Instances are drawn at check time from the OS's randomness (:mod:`.instances`): 2, 3, 4 and 5 ranks, numbers of
blocks that do not divide by the world size (and fewer blocks than ranks: a rank with nothing), odd block sizes and
horizons, a large volatility (so that a missing Ito term or a wrong time step shows in the statistics), ranks
holding unequal numbers of paths, none at all, frozen parameters and one no rank uses. The answer runs on the
grader's workers, one process per rank; the all-reduce's bytes are read from the kernel's TCP counters
(:mod:`.wire`), below any Python name the answer uses.
"""

from __future__ import annotations

import math

from .core import Result, _close, exercise
from .dp_common import only_some_sizes
from .instances import draw, secret_seed

_DT = 1 / 252

# ---- finance_paths: each rank's Monte-Carlo paths ----


def paths_instance(world: int):
    """A Hypothesis strategy of one ``paths`` problem on ``world`` ranks: blocks mostly not dividing by the world
    size (sometimes fewer than the ranks), odd block sizes and horizons, two steps, a secret seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            ranks=st.just(world),
            blocks=st.integers(1, 3 * world + 2).filter(lambda b: b % world or b == 1),
            block=st.integers(1, 9),
            days=st.integers(2, 11),
            vol=st.floats(0.1, 0.9).map(lambda v: round(v, 3)),
            step=st.integers(0, 10_000),
            seed=st.integers(0, 2**31),
        )
    )


def _spec(instance: dict):
    """The task the answer sees: the fields of ``HedgingTask`` it needs, and no simulator of the course's."""
    from types import SimpleNamespace

    return SimpleNamespace(
        global_batch=instance["blocks"] * instance["block"],
        block=instance["block"],
        days=instance["days"],
        vol=instance["vol"],
        seed=instance["seed"],
    )


def _paths_harness(answer, instances):
    """On every rank: the answer's paths for each instance's step, the next step, the first step again, and the
    next rank's paths asked from this rank (a pure function of its arguments gives what that rank returns); the
    normal numbers drawn for this rank's own share, counted below every Python name (a dispatch mode)."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    class Normals(TorchDispatchMode):
        drawn = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if ("normal" in name or "randn" in name or "rand" in name) and isinstance(out, torch.Tensor):
                Normals.drawn += out.numel()
            return out

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for instance in instances:
        task, step = _spec(instance), instance["step"]
        got = {}
        Normals.drawn = 0
        for key, s, r in (("first", step, rank), ("next", step + 1, rank), ("again", step, rank)):
            if key == "first":
                with Normals():
                    p = answer(task, s, r, world)
                got["drawn"] = Normals.drawn
            else:
                p = answer(task, s, r, world)
            got[key] = p.detach().to("cpu", torch.float64).clone() if isinstance(p, torch.Tensor) else None
        p = answer(task, step, (rank + 1) % world, world)
        got["neighbour"] = p.detach().to("cpu", torch.float64).clone() if isinstance(p, torch.Tensor) else None
        out.append(got)
    return out


def _fingerprints(x):
    import torch

    w = torch.linspace(1.0, 2.0, x.shape[1], dtype=torch.float64)
    return (x.double() * w).sum(1)


def _shape_breach(parts, instance) -> str:
    total = instance["blocks"] * instance["block"]
    days = instance["days"]
    for r, p in enumerate(parts):
        if p is None:
            return f"rank {r} returned no tensor"
        if p.dim() != 2 or p.shape[1] != days + 1:
            return f"rank {r} returned shape {tuple(p.shape)}; its paths must be (paths of this rank, days + 1 = {days + 1})"
    rows = [p.shape[0] for p in parts]
    if sum(rows) != total:
        return f"the ranks' paths add up to {sum(rows)} ({rows}); the global batch is {total}"
    if max(rows) - min(rows) > instance["block"]:
        return f"the ranks hold {rows} paths: unbalanced (more than one block of {instance['block']} apart)"
    return ""


def _same_rows(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-6, atol=1e-9))


def _repeats(parts_by_step) -> str:
    """A row seen twice among all ranks' paths of both steps, said in words; "" when none repeats."""
    import torch

    rows, owners = [], []
    for label, parts in parts_by_step:
        for r, p in enumerate(parts):
            rows.append(p)
            owners += [(label, r)] * p.shape[0]
    if not rows:
        return ""
    allp = torch.cat(rows)
    fp = _fingerprints(allp[:, 1:] if allp.shape[1] > 1 else allp)
    order = torch.argsort(fp)
    fs = fp[order]
    for i in range(len(fs) - 1):
        a, b = int(order[i]), int(order[i + 1])
        if torch.isclose(fs[i], fs[i + 1], rtol=0, atol=1e-12) and torch.equal(allp[a], allp[b]):
            (sa, ra), (sb, rb) = owners[a], owners[b]
            return f"a path of rank {ra} at {sa} step is also a path of rank {rb} at {sb} step"
    return ""


def _sorted_rows(x):
    import torch

    return x[torch.argsort(_fingerprints(x))] if x.shape[0] else x


def _stats_breach(paths, vol: float) -> str:
    """The paths are zero-drift GBM with volatility ``vol`` and daily steps: S_0 = 1, log returns with mean
    -vol^2 dt / 2 and standard deviation vol sqrt(dt), uncorrelated from day to day (5 standard errors)."""
    import torch

    if not torch.allclose(paths[:, 0], torch.ones_like(paths[:, 0])):
        return "the paths do not start at S_0 = 1 (column 0 is the price today)"
    if bool((paths <= 0).any()) or not bool(torch.isfinite(paths).all()):
        return "some prices are not positive and finite: a GBM price is S_0 exp(sum of log returns)"
    r = torch.log(paths[:, 1:] / paths[:, :-1]).double()
    n = r.numel()
    sd, want_sd = float(r.std()), vol * math.sqrt(_DT)
    if abs(sd / want_sd - 1) > 5 / math.sqrt(2 * n) + 0.01:
        return (
            f"the daily log returns have standard deviation {sd:.5f}; vol sqrt(dt) = {want_sd:.5f} (vol {vol}, "
            "dt = 1/252 of a year)"
        )
    mean, want = float(r.mean()), -0.5 * vol**2 * _DT
    if abs(mean - want) > 5 * want_sd / math.sqrt(n):
        return (
            f"the daily log returns have mean {mean:.2e}; zero drift needs -vol^2 dt / 2 = {want:.2e} (the Ito "
            "term: without it E[S_T] drifts above S_0 = 1)"
        )
    if r.shape[1] > 2:
        a, b = r[:, :-1].reshape(-1), r[:, 1:].reshape(-1)
        corr = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
        if abs(corr) > 5 / math.sqrt(a.numel()):
            return f"one day's log return is correlated with the next ({corr:+.3f}): each day needs its own draw"
    return ""


_PATHS_WORLDS = (2, 3, 4, 5)
_NAMES = dict(ranks="ranks", blocks="blocks of", block="paths each,", days="days,", vol="vol", step="step")


def _words(instance: dict) -> str:
    return (
        f"{instance['ranks']} ranks, {instance['blocks']} blocks of {instance['block']} paths, "
        f"{instance['days']} days, vol {instance['vol']}, step {instance['step']}"
    )


@exercise("finance_paths")
def _check_paths(answer, grader):
    import torch
    from hypothesis import strategies as st

    drawn = {w: draw(st.lists(paths_instance(w), min_size=2, max_size=2), 1)[0] for w in _PATHS_WORLDS}
    big = dict(ranks=2, blocks=65, block=64, days=20, vol=1.2, step=secret_seed() % 10_000, seed=secret_seed())
    drawn[2] = drawn[2] + [big]  # enough paths (4,160 x 20 log returns) for the statistics
    flat = [c for cases in drawn.values() for c in cases]
    wholes = iter(grader.run(1, _whole_harness, answer, flat, what="your code in one process")[0])
    alone = {w: [next(wholes) for _ in cases] for w, cases in drawn.items()}  # each instance's world size 1
    passed = []
    for world, cases in drawn.items():
        outs = grader.run(world, _paths_harness, answer, cases)
        bad = {}
        for i, instance in enumerate(cases):
            per = [o[i] for o in outs]
            first = [p["first"] for p in per]
            breach = _shape_breach(first, instance) or _shape_breach([p["next"] for p in per], instance)
            if breach:
                bad.setdefault("shape", (instance, breach))
                continue
            if not all(p["again"] is not None and _same_rows(p["again"], p["first"]) for p in per):
                bad.setdefault("again", (instance, "a rank returned other paths when asked again for the same step"))
            elif not all(
                p["neighbour"] is not None and _same_rows(p["neighbour"], per[(r + 1) % world]["first"])
                for r, p in enumerate(per)
            ):
                bad.setdefault(
                    "again", (instance, "rank r asked for rank r + 1's paths got other paths than rank r + 1 returned")
                )
            extra = [p["drawn"] - p["first"].shape[0] * instance["days"] for p in per]
            if max(extra) > instance["block"] * instance["days"]:
                r = extra.index(max(extra))
                bad.setdefault(
                    "share",
                    (
                        instance,
                        f"rank {r} drew {per[r]['drawn']:,} normal numbers for its {per[r]['first'].shape[0]} paths "
                        f"of {instance['days']} days ({per[r]['first'].shape[0] * instance['days']:,} needed)",
                    ),
                )
            rep = _repeats([("the first", first), ("the next", [p["next"] for p in per])])
            if rep:
                bad.setdefault("distinct", (instance, rep))
            whole = alone[world][i]["whole"]
            union = torch.cat(first)
            if whole is None or not _same_rows(_sorted_rows(union), _sorted_rows(whole)):
                bad.setdefault(
                    "world", (instance, "the ranks' paths together are not the paths one process draws alone")
                )
            if instance is big:
                stats = _stats_breach(union.float(), instance["vol"])
                if stats:
                    bad.setdefault("stats", (instance, stats))
        yield from _paths_results(world, bad, passed)
        passed += [f"{world} ranks"] if not bad else []


def _paths_results(world, bad, passed):
    checks = (
        (
            "shape",
            "each rank returns its share: (its paths, days + 1), together the global batch, balanced",
            "rank r of n simulates the blocks range(r * B // n, (r + 1) * B // n) of the B = global_batch // block "
            "blocks (contiguous, balanced: when B does not divide by n some ranks hold one block more, and with "
            "fewer blocks than ranks some hold none: return torch.empty(0, days + 1)); each block has `block` "
            "paths of days + 1 prices",
        ),
        (
            "again",
            "the same (step, rank, world) gives the same paths, whoever asks (deterministic)",
            "the paths must be a function of (task, step, rank, world) alone: use the rank and world passed in (not "
            "torch.distributed's), and seed a generator for each draw (torch.Generator().manual_seed(...), or "
            "simlib.projects.seeding.generator(*keys)) and pass it to torch.randn(..., generator=g): the global "
            "torch.manual_seed state or an unseeded draw changes from call to call",
        ),
        (
            "share",
            "each rank simulates only its own share (normal numbers drawn, counted below Python)",
            "simulate only this rank's blocks: drawing the whole global batch on every rank and keeping a slice gives "
            "the right paths for world-size times the work, which is what data-parallel generation saves",
        ),
        (
            "distinct",
            "no path repeats across ranks or steps (independent streams)",
            "a stream must belong to one (step, block): seed it from all of them, e.g. generator(task.seed, 5, "
            "step, b) (numpy's SeedSequence mixes the keys). seed + rank repeats rank 1's numbers at the next "
            "step on rank 0 (seed + step + rank collides), and a seed without the step draws the same paths "
            "every step",
        ),
        (
            "world",
            "the ranks' paths together equal one process's global batch (one process equals many)",
            "seed each BLOCK, not each rank: with one generator per rank (seeded from the rank), the global batch "
            "changes with the world size, so a 2-rank run no longer trains on what a 1-rank run trains on. Draw "
            "block b from its own stream whatever rank simulates it",
        ),
        (
            "stats",
            "the paths are the model's: S_0 = 1, daily log returns -vol^2 dt / 2 + vol sqrt(dt) z",
            "zero-drift geometric Brownian motion: log S_t+1 - log S_t = -0.5 vol^2 dt + vol sqrt(dt) z with "
            "dt = 1/252 and z ~ N(0, 1) a fresh draw for each path and day; prices are exp of the cumulative sum, "
            "after a first column of ones",
        ),
    )
    for key, name, hint in checks:
        if key == "stats" and world != 2:
            continue
        ok = key not in bad
        detail = ""
        if not ok:
            instance, why = bad[key]
            detail = f"{why} (with {_words(instance)})"
            hint += only_some_sizes(passed, f"{world} ranks")
        yield Result(f"{world} ranks: {name}", ok, hint, detail)


def _whole_harness(answer, instances):
    """One process: the answer's paths of each instance's first step at world size 1 (the global batch)."""
    import torch

    out = []
    for instance in instances:
        p = answer(_spec(instance), instance["step"], 0, 1)
        out.append(dict(whole=p.detach().to("cpu", torch.float64).clone() if isinstance(p, torch.Tensor) else None))
    return out


# ---- finance_grad_average: the count-weighted average of the gradients and the loss ----


def average_instance(world: int, wide: bool = False):
    """A Hypothesis strategy of one ``grad_average`` problem on ``world`` ranks: unequal numbers of paths per rank
    (some rank with none, always some rank with several), a small hedging network, a secret seed."""
    from hypothesis import strategies as st

    counts = st.lists(st.integers(0, 9), min_size=world, max_size=world).filter(
        lambda c: sum(c) > 1 and len(set(c)) > 1 and 0 in c
    )
    return st.fixed_dictionaries(
        dict(
            ranks=st.just(world),
            counts=counts,
            days=st.integers(2, 6),
            hidden=st.integers(150, 220) if wide else st.integers(3, 9),  # wide: bytes on the wire to measure
            depth=st.just(2) if wide else st.integers(1, 2),
            seed=st.integers(0, 2**31),
        )
    )


def _problem(instance: dict):
    """(model, paths per rank, payoffs per rank): HedgeNet with a frozen premium and a parameter no rank uses."""
    import torch

    from ..projects.finance.pieces import gbm_block
    from ..projects.finance.task import HedgeNet

    torch.manual_seed(instance["seed"])
    model = HedgeNet(instance["days"], 0.3, hidden=instance["hidden"], depth=instance["depth"])
    for p in model.net[-1].parameters():  # the zero-initialised head would leave the hidden layers' gradients 0
        torch.nn.init.normal_(p, std=0.3)
    model.premium.requires_grad_(False)  # frozen: no rank has a gradient, and no rank may send one for it
    model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))  # no rank's forward uses it: None
    parts = []
    for r, n in enumerate(instance["counts"]):
        x = gbm_block(n, instance["days"], 0.3, (instance["seed"], r))
        parts.append((x, (x[:, -1] - 1).clamp_min(0)))
    return model, parts


def _reference_average(instance: dict) -> dict:
    """One process on every rank's paths together: the mean loss and its gradients; and the plain mean of the
    ranks' means (the wrong answer a hint names)."""
    import torch

    model, parts = _problem(instance)
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    loss = torch.mean((model(x) - y) ** 2)
    loss.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    means = []
    for xr, yr in parts:
        if len(xr):
            model.zero_grad(set_to_none=True)
            torch.mean((model(xr) - yr) ** 2).backward()
            means.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
    plain = [  # the plain mean of the ranks' means: over the ranks holding paths, and over every rank
        [None if g is None else sum(m[i] for m in means) / k for i, g in enumerate(grads)]
        for k in (len(means), len(parts))
    ]
    names = [n + " (frozen)" * (not p.requires_grad) for n, p in model.named_parameters()]
    return dict(grads=grads, loss=float(loss.detach()), plain=plain, names=names)


def _average_harness(answer, instance):
    """On every rank: this rank's paths forward and backward (none when it holds none), then the answer."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    model, parts = _problem(instance)
    x, y = parts[rank]
    loss = float("nan")  # the mean over no paths
    if len(x):
        out = torch.mean((model(x) - y) ** 2)
        out.backward()
        loss = float(out.detach())
    got = answer(list(model.parameters()), loss, len(x), None)
    return dict(
        grads=[None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
        loss=float(got) if isinstance(got, (int, float, torch.Tensor)) and not isinstance(got, bool) else None,
        numel=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )


def _grads_equal(got, want) -> bool:
    return len(got) == len(want) and all(
        (g is None and w is None) or (g is not None and w is not None and _close(g, w, rtol=1e-4, atol=1e-6))
        for g, w in zip(got, want)
    )


def _diagnose_average(outs, ref, instance) -> tuple[str, str]:
    """(detail, hint) for the first wrong rank, or ("", "")."""
    names = ref["names"]
    for r, out in enumerate(outs):
        if _grads_equal(out["grads"], ref["grads"]):
            continue
        for i, (g, w) in enumerate(zip(out["grads"], ref["grads"])):
            if w is None and g is not None:
                return (
                    f"rank {r} holds a gradient for {names[i]}, which no rank has one for",
                    "leave p.grad None where no rank has a gradient (a frozen parameter, one the forward never "
                    "uses): send a flag with the gradients (1 where this rank has one) and set p.grad only where "
                    "the summed flag is > 0; skip parameters with requires_grad False",
                )
            if w is not None and g is None:
                return (
                    f"rank {r} has no gradient for {names[i]} after the average",
                    "a rank with no paths (count 0) ran no backward: its p.grad is None, but it must still take part "
                    "in the all-reduce (with zeros of p's shape) and receive the average",
                )
        if any(_grads_equal(out["grads"], plain) for plain in ref["plain"]):
            return (
                f"rank {r}: the plain mean of the ranks' mean gradients",
                "each rank's gradient is the mean over ITS paths, and the ranks hold "
                f"{instance['counts']} paths: weight each by its count, sum over ranks (all-reduce of count * "
                "grad and of count), divide by the total count. A plain mean of means (divide by the world size) "
                "is right only when every rank holds as many paths",
            )
        return (
            f"rank {r}'s gradients differ from the one-process gradient of all paths",
            "the global-batch gradient is sum_r count_r * grad_r / sum_r count_r: all-reduce (SUM) the weighted "
            "gradients and the counts, then divide by the total count (not the world size)",
        )
    return "", ""


_AVERAGE_WORLDS = (2, 3, 4, 5)


@exercise("finance_grad_average")
def _check_grad_average(answer, grader):
    drawn = {w: draw(average_instance(w, wide=w == 4), 1)[0] for w in _AVERAGE_WORLDS}
    passed = []
    for world, instance in drawn.items():
        ref = _reference_average(instance)
        metered = world == 4
        outs = grader.run(world, _average_harness, answer, instance, wire=metered)
        words = f" (ranks holding {instance['counts']} paths, {instance['days']} days, hidden {instance['hidden']})"
        detail, hint = _diagnose_average(outs, ref, instance)
        yield Result(
            f"{world} ranks, unequal paths: gradients equal one process's on all paths",
            not detail,
            hint + ("" if not detail else only_some_sizes(passed, f"{world} ranks")),
            detail + ("" if not detail else words),
        )
        losses = [o["loss"] for o in outs]
        ok = all(v is not None and math.isfinite(v) and math.isclose(v, ref["loss"], rel_tol=1e-4) for v in losses)
        yield Result(
            f"{world} ranks: the returned loss is the mean over all paths, on every rank",
            ok,
            "return the loss logged for the step: sum_r count_r * loss_r / sum_r count_r (in the same all-reduce "
            "as the gradients). A rank without paths has loss nan (a mean over nothing): its weight is 0, so send "
            "0.0 for it, never nan * 0 (which is nan)",
            "" if ok else f"returned {losses}; the mean over all paths is {ref['loss']:.6g}" + words,
        )
        passed += [f"{world} ranks"] if not detail and ok else []
        if metered and grader.wire_last is not None:
            yield _wire_result(grader.wire_last, outs[0]["numel"], world)


def _wire_result(pairs: dict, numel: int, world: int) -> Result:
    """One all-reduce of the gradients puts about 2(n-1)/n of them on the wire per rank; allow 1.5x that (the
    count, the loss, a flag per tensor and Gloo's headers) plus 8 KiB: two all-reduces of the gradients, or an
    all_gather of them, move 2x or more."""
    payload = 2 * (world - 1) / world * numel * 4
    bound = 1.5 * payload + 8192
    worst = max((sum(v[0] for (s, _), v in pairs.items() if s == r) for r in range(world)), default=0)
    return Result(
        f"{world} ranks: on the wire (the kernel's TCP counters), no more than one all-reduce of the gradients",
        worst <= bound,
        "pack what each rank sends into ONE all-reduce: the weighted gradients, the weighted loss and the count "
        "in one flat buffer (torch.cat), sum it, then divide. Gathering every rank's gradients (all_gather) or "
        "all-reducing them twice moves twice as much or more",
        f"a rank sent {worst:,} bytes; one all-reduce of the {numel:,} gradient elements sends about {payload:,.0f}",
    )
