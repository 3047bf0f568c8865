"""Check of the finance project's ``grad_average`` piece (``simlib/projects/finance/pieces.py``; the slots of its
``run.py``): the count-weighted average of the gradients and of the logged loss over ranks holding unequal numbers of
paths (some none), with a frozen parameter and one no rank uses; one all-reduce's bytes, read from the kernel's TCP
counters (:mod:`.wire`). The ``paths`` piece's check is :mod:`.finance_pieces`."""

from __future__ import annotations

import math

from .core import Result, _close, exercise
from .dp_common import only_some_sizes
from .instances import draw, smallest

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
        detail, hint = _diagnose_average(outs, ref, instance)
        shown = instance
        if detail:  # the hint names the smallest instance Hypothesis finds that still fails
            strategy = average_instance(world, wide=world == 4)
            small = smallest(strategy, lambda i: _average_fails(grader, answer, world, i), 4, instance)
            if small is not None and small is not instance:
                outs_small = grader.run(world, _average_harness, answer, small)
                again = _diagnose_average(outs_small, _reference_average(small), small)
                if again[0]:
                    shown, (detail, hint) = small, again
        words = f" (ranks holding {shown['counts']} paths, {shown['days']} days, hidden {shown['hidden']})"
        loss_words = f" (ranks holding {instance['counts']} paths)"
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
            "" if ok else f"returned {losses}; the mean over all paths is {ref['loss']:.6g}" + loss_words,
        )
        passed += [f"{world} ranks"] if not detail and ok else []
        if metered and grader.wire_last is not None:
            yield _wire_result(grader.wire_last, outs[0]["numel"], world)


def _average_fails(grader, answer, world: int, instance: dict) -> bool:
    outs = grader.run(world, _average_harness, answer, instance)
    return bool(_diagnose_average(outs, _reference_average(instance), instance)[0])


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
