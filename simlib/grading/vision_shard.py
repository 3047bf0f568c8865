"""Checks for the vision project's second learner piece, the data shard (``data_shard``;
``solutions/11_vision_pieces.ipynb``): which samples each rank reads at a step.

The answer is called in the grader's workers on 2 to 5 ranks, each rank with its own global random state, for whole
epochs' worth of steps (two epochs at least) and one far later, on dataset sizes that divide neither the world size
nor the batch, batches longer than the dataset, and a batch that does not split (which must be refused); the
instances are drawn at check time (:mod:`.instances`). Its parts must be the course's stream
(:mod:`simlib.projects.vision.sampler`); a failure names the smallest failing instance among a grid of tiny ones the
workers also try, and says which property broke (a sample read twice in an epoch or never, ranks disagreeing, the
arrangement of the parts).
"""

from __future__ import annotations

from .core import Result, exercise

_SHARD_WORLDS = (2, 3, 4, 5)


def shard_case(world_size: int, kind: str):
    """A Hypothesis strategy of one data-shard instance on ``world_size`` ranks: "straddle" (a batch crosses an
    epoch's end; the dataset divides neither the world size nor the batch), "big" (a batch longer than the dataset),
    "refuse" (a batch that does not split into ``world_size`` parts)."""
    from hypothesis import strategies as st

    n = st.integers(world_size + 1, 60).filter(lambda v: v % world_size)
    if kind == "refuse":
        batch = st.integers(world_size + 1, 4 * world_size).filter(lambda b: b % world_size)
        return st.fixed_dictionaries(
            dict(kind=st.just(kind), num_samples=n, global_batch=batch, seed=st.integers(0, 2**62))
        )

    def with_batch(num):
        if kind == "big":
            ks = st.integers(num // world_size + 1, (5 * num) // (2 * world_size) + 1)
        else:
            ks = st.integers(1, max(1, (num - 1) // world_size)).filter(lambda k: num % (k * world_size))
        return ks.map(lambda k: (num, k * world_size))

    pair = n.flatmap(with_batch).filter(lambda nb: nb[0] % nb[1] != 0)
    return st.fixed_dictionaries(dict(kind=st.just(kind), pair=pair, seed=st.integers(0, 2**62))).map(
        lambda d: dict(kind=d["kind"], num_samples=d["pair"][0], global_batch=d["pair"][1], seed=d["seed"])
    )


def _shard_cases() -> dict:
    from hypothesis import strategies as st

    from .instances import draw

    kinds = ("straddle", "straddle", "big", "refuse")
    strategy = st.tuples(*(st.tuples(*(shard_case(w, k) for k in kinds)) for w in _SHARD_WORLDS))
    drawn = draw(strategy, 1)[0]
    out = {}
    for i, w in enumerate(_SHARD_WORLDS):
        out[w] = []
        for c in drawn[i]:
            c = dict(c)
            if c["kind"] != "refuse":  # whole epochs' worth of steps (two epochs at least), and one far later
                c["steps"] = list(range(_whole_epochs(c["num_samples"], c["global_batch"]))) + [1000 + c["seed"] % 997]
            else:
                c["steps"] = [0]
            out[w].append(c)
    return out


def _whole_epochs(n: int, b: int) -> int:
    """Steps from 0 that read a whole number of epochs (and two epochs at least): n / gcd(n, b) steps, repeated."""
    import math

    whole = n // math.gcd(n, b)
    return whole * -(-(2 * n) // (whole * b))


def _order(seed: int, num_samples: int):
    """The instance's ``order(epoch)``: a permutation per epoch from (seed, epoch), as the training's."""
    import torch

    def order(epoch: int):
        return torch.randperm(num_samples, generator=torch.Generator().manual_seed((seed * 1_000_003 + epoch) % 2**62))

    return order


def _tiny_grid(world_size: int) -> list:
    """Small instances every worker also tries (the hint names the smallest failing one)."""
    out = []
    for n in range(2, 11):
        for k in (1, 2, 3):
            b = k * world_size
            out.append(
                dict(
                    kind="tiny", num_samples=n, global_batch=b, seed=n * 31 + b, steps=list(range(_whole_epochs(n, b)))
                )
            )
    return out


def _as_indices(got):
    """The answer's return as (list of ints, problem or "")."""
    import torch

    if not isinstance(got, torch.Tensor):
        return None, f"returned {type(got).__name__}, not a torch tensor"
    if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
        return None, f"returned a {got.dtype} tensor; sample indices are integers (torch.long)"
    if got.dim() != 1:
        return None, f"returned a tensor of shape {tuple(got.shape)}; one index per sample: 1-D"
    return [int(v) for v in got.tolist()], ""


def _shard_harness(answer, cases, tiny_too):
    """Each case's parts on this rank (and again under another global random state: the same?)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out, tiny = [], []
    for case in cases:
        order = _order(case["seed"], case["num_samples"])
        args = (rank, world, case["global_batch"], case["num_samples"], order)
        if case["kind"] == "refuse":
            try:
                got = answer(0, *args)
                out.append(dict(refused=False, returned=str(type(got).__name__)))
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - the answer must refuse: any exception counts
                out.append(dict(refused=True, error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        torch.manual_seed(case["seed"] % 2**31 + 7919 * rank)  # each rank's own global random state
        parts, problem = [], ""
        for step in case["steps"]:
            idx, problem = _as_indices(answer(step, *args))
            if problem:
                problem = f"at step {step}: {problem}"
                break
            parts.append(idx)
        torch.manual_seed(case["seed"] % 2**31 + 104729 * (rank + 1))  # another global state: the same parts?
        again = _as_indices(answer(case["steps"][1], *args))[0] if not problem else None
        out.append(dict(parts=parts, problem=problem, again=again))
    if tiny_too:
        for case in _tiny_grid(world):
            order = _order(case["seed"], case["num_samples"])
            try:
                got = [
                    _as_indices(answer(s, rank, world, case["global_batch"], case["num_samples"], order))[0]
                    for s in case["steps"]
                ]
            except NotImplementedError:
                raise
            except Exception:  # noqa: BLE001 - a failing tiny instance is just a failing one
                got = None
            tiny.append(got)
    return dict(cases=out, tiny=tiny)


def _reference_parts(case, world):
    from ..projects.vision.sampler import data_shard

    order = _order(case["seed"], case["num_samples"])
    return [
        [data_shard(s, r, world, case["global_batch"], case["num_samples"], order).tolist() for s in case["steps"]]
        for r in range(world)
    ]


def _describe_shard(world, case) -> str:
    return f"{world} ranks, {case['num_samples']} samples, global batch {case['global_batch']}"


def _shard_property(case, world, parts) -> str:
    """Which property the answer's parts (``parts[rank][step]``) break, in words; "" when none: over the steps from 0
    that read whole epochs every sample is read equally often (once per epoch), and a step inside one epoch reads
    no sample twice."""
    from collections import Counter

    n, b = case["num_samples"], case["global_batch"]
    steps = case["steps"]
    for si, step in enumerate(steps):
        seen = [i for r in range(world) for i in parts[r][si]]
        inside = (step * b) // n == ((step + 1) * b - 1) // n
        if inside and len(set(seen)) < len(seen):
            return (
                f"at step {step} (inside one epoch) two ranks, or one rank twice, read the same sample: each rank "
                f"takes its own part of the step's global batch"
            )
    whole = [si for si, s in enumerate(steps) if s == si]  # the steps 0, 1, 2, ... (whole epochs)
    counts = Counter(i for si in whole for r in range(world) for i in parts[r][si])
    epochs = len(whole) * b // n
    off = sorted(i for i in range(n) if counts.get(i, 0) != epochs)
    if off:
        i = off[0]
        return (
            f"over steps 0..{len(whole) - 1} ({epochs} epochs) sample {i} was read {counts.get(i, 0)} times, not "
            f"{epochs}: every epoch reads each sample once; a batch that crosses an epoch's end takes the rest of "
            f"that epoch's order and the start of the next epoch's (positions ≥ num_samples)"
        )
    return ""


@exercise("data_shard")
def _check_data_shard(answer, grader):
    cases = _shard_cases()
    got = {}
    for world in _SHARD_WORLDS:
        got[world] = grader.run(world, _shard_harness, answer, cases[world], True)
    # 1. the parts' form
    problems = [
        (w, c, got[w][r]["cases"][i]["problem"])
        for w in _SHARD_WORLDS
        for i, c in enumerate(cases[w])
        if c["kind"] != "refuse"
        for r in range(w)
        if got[w][r]["cases"][i]["problem"]
    ]
    sizes_ok = not problems and all(
        len(p) == c["global_batch"] // w
        for w in _SHARD_WORLDS
        for i, c in enumerate(cases[w])
        if c["kind"] != "refuse"
        for r in range(w)
        for p in got[w][r]["cases"][i]["parts"]
    )
    hint = ""
    if problems:
        w, c, p = problems[0]
        hint = f"{p} ({_describe_shard(w, c)}); return torch.long indices, global_batch // world_size of them"
    elif not sizes_ok:
        hint = "each rank reads global_batch // world_size samples a step"
    yield Result("each rank's part: global_batch / world_size integer indices (2 to 5 ranks)", sizes_ok, hint=hint)
    if problems:
        return
    # 2. the parts, in rank order, are the stream's global batch
    wrong = []
    for w in _SHARD_WORLDS:
        for i, c in enumerate(cases[w]):
            if c["kind"] == "refuse":
                continue
            mine = [got[w][r]["cases"][i]["parts"] for r in range(w)]
            if mine != _reference_parts(c, w):
                wrong.append((w, c, mine))
    tiny_fail = []
    for w in _SHARD_WORLDS:
        for j, c in enumerate(_tiny_grid(w)):
            mine = [got[w][r]["tiny"][j] for r in range(w)]
            if mine != _reference_parts(c, w):
                tiny_fail.append((c["num_samples"] + c["global_batch"], w, c))
    smallest = ""
    if tiny_fail:
        _, w, c = min(tiny_fail, key=lambda t: (t[0], t[1]))
        smallest = f" Smallest failing instance: {_describe_shard(w, c)}."
    elif wrong:
        w, c, _ = min(wrong, key=lambda t: (t[1]["num_samples"], t[0]))
        smallest = f" Failing instance: {_describe_shard(w, c)}."
    hint = ""
    if wrong:
        w, c, mine = wrong[0]
        why = _shard_property(c, w, mine)
        if not why:
            why = (
                "the right samples in another arrangement: rank r reads the r-th contiguous block of the step's "
                "global batch (positions step·B + r·B/world ...), so that the parts in rank order are the global "
                "batch whatever the world size"
            )
        hint = why + "." + smallest
    yield Result(
        "the parts of a step, in rank order, are the step's global batch of the epoch-by-epoch stream",
        not wrong,
        hint=hint,
        detail=f"{len(wrong)} of {sum(c['kind'] != 'refuse' for w in _SHARD_WORLDS for c in cases[w])} instances wrong"
        if wrong
        else "",
    )
    # 3. every sample once per epoch, over the ranks
    broken = [(w, c) for w, c, mine in wrong if _shard_property(c, w, mine)]
    yield Result(
        "every sample read exactly once per epoch over all ranks, also across an epoch's end and batches longer "
        "than the dataset",
        not broken,
        hint=(
            _shard_property(broken[0][1], broken[0][0], next(m for w, c, m in wrong if c is broken[0][1]))
            + "."
            + smallest
        )
        if broken
        else "",
    )
    # 4. only order(epoch) decides: the same parts under another random state
    moved = [
        (w, c)
        for w in _SHARD_WORLDS
        for i, c in enumerate(cases[w])
        if c["kind"] != "refuse"
        for r in range(w)
        if got[w][r]["cases"][i]["again"] != got[w][r]["cases"][i]["parts"][1]
    ]
    yield Result(
        "the same parts whatever the process's own random state (every rank agrees, from (seed, epoch) alone)",
        not moved,
        hint="your parts changed with the process's global random state: shuffle only with order(epoch), which "
        "every rank computes alike; torch.randperm without that order draws a different permutation on each rank"
        + (f" ({_describe_shard(*moved[0])})" if moved else ""),
    )
    # 5. a batch that does not split is refused
    silent = [
        (w, c, got[w][r]["cases"][i])
        for w in _SHARD_WORLDS
        for i, c in enumerate(cases[w])
        if c["kind"] == "refuse"
        for r in range(w)
        if not got[w][r]["cases"][i]["refused"]
    ]
    yield Result(
        "a global batch that does not split into world_size equal parts is refused with an error",
        not silent,
        hint=(
            f"with {_describe_shard(silent[0][0], silent[0][1])} your function returned a "
            f"{silent[0][2]['returned']}: raise a ValueError saying the batch does not divide by the world size "
            "(equal parts keep the ranks' collectives the same size)"
        )
        if silent
        else "",
    )


# the vision project's milestone earned with both pieces in its training ("vision_pieces_milestone"): each piece by
# its exercise above, then "vision_milestone" with the grader's re-runs training with the answer's pieces
from .pieces_milestone import pieces_milestone  # noqa: E402

pieces_milestone("vision")
