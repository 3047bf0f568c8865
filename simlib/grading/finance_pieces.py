"""Checks of the finance project's two learner pieces (``simlib/projects/finance/pieces.py``; the slots of its
``run.py``): ``finance_paths`` (each rank's Monte-Carlo paths) here, and ``finance_grad_average`` (the count-weighted
gradient and loss average) in :mod:`.finance_average`, which this module imports (so importing it registers both).

Instances are drawn at check time from the OS's randomness (:mod:`.instances`): 2, 3, 4 and 5 ranks, numbers of
blocks that do not divide by the world size (and fewer blocks than ranks: a rank with nothing), odd block sizes and
horizons, a large volatility (so that a missing Ito term or a wrong time step shows in the statistics), ranks
holding unequal numbers of paths, none at all, frozen parameters and one no rank uses. The answer runs on the
grader's workers, one process per rank; the all-reduce's bytes are read from the kernel's TCP counters
(:mod:`.wire`), below any Python name the answer uses.
"""

from __future__ import annotations

import math

from .core import Result, exercise
from .dp_common import only_some_sizes
from .instances import draw, secret_seed, smallest

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


def _words(instance: dict) -> str:
    return (
        f"{instance['ranks']} ranks, {instance['blocks']} blocks of {instance['block']} paths, "
        f"{instance['days']} days, vol {instance['vol']}, step {instance['step']}"
    )


@exercise("finance_paths")
def _check_paths(answer, grader):
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
            faults = _faults([o[i] for o in outs], alone[world][i]["whole"], instance, stats=instance is big)
            for key, why in faults.items():
                bad.setdefault(key, (instance, why))
        for key, (instance, why) in list(bad.items()):
            if key != "stats":  # the hint names the smallest instance Hypothesis finds that fails the same way
                small = smallest(
                    paths_instance(world), lambda i, k=key: k in _faults_on(grader, answer, world, i), 4, instance
                )
                if small is not instance and small is not None:
                    bad[key] = (small, _faults_on(grader, answer, world, small).get(key, why))
        yield from _paths_results(world, bad, passed)
        passed += [f"{world} ranks"] if not bad else []


def _faults_on(grader, answer, world: int, instance: dict) -> dict:
    """The faults of the answer on one instance (two runs: one process, then ``world`` ranks)."""
    whole = grader.run(1, _whole_harness, answer, [instance], what="your code in one process")[0][0]["whole"]
    outs = grader.run(world, _paths_harness, answer, [instance])
    return _faults([o[0] for o in outs], whole, instance)


def _faults(per, whole, instance: dict, stats: bool = False) -> dict:
    """{check key: what is wrong} for one instance: ``per`` the ranks' results, ``whole`` one process's batch."""
    import torch

    world, out = len(per), {}
    first = [p["first"] for p in per]
    breach = _shape_breach(first, instance) or _shape_breach([p["next"] for p in per], instance)
    if breach:
        return {"shape": breach}
    if not all(p["again"] is not None and _same_rows(p["again"], p["first"]) for p in per):
        out["again"] = "a rank returned other paths when asked again for the same step"
    elif not all(
        p["neighbour"] is not None and _same_rows(p["neighbour"], per[(r + 1) % world]["first"])
        for r, p in enumerate(per)
    ):
        out["again"] = "rank r asked for rank r + 1's paths got other paths than rank r + 1 returned"
    extra = [p["drawn"] - p["first"].shape[0] * instance["days"] for p in per]
    if max(extra) > instance["block"] * instance["days"]:
        r = extra.index(max(extra))
        rows = per[r]["first"].shape[0]
        out["share"] = (
            f"rank {r} drew {per[r]['drawn']:,} normal numbers for its {rows} paths of {instance['days']} days "
            f"({rows * instance['days']:,} needed)"
        )
    rep = _repeats([("the first", first), ("the next", [p["next"] for p in per])])
    if rep:
        out["distinct"] = rep
    union = torch.cat(first)
    if whole is None or not _same_rows(_sorted_rows(union), _sorted_rows(whole)):
        out["world"] = "the ranks' paths together are not the paths one process draws alone"
    if stats:
        breach = _stats_breach(union.float(), instance["vol"])
        if breach:
            out["stats"] = breach
    return out


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


from . import finance_average  # noqa: E402,F401 - registers finance_grad_average
