"""Checks for lesson 05: column- and row-parallel Linear as autograd functions (Megatron's MLP), on a drawn
problem at 2, 3 and 4 ranks; a failure's hint names the smallest failing instance Hypothesis finds."""

from __future__ import annotations

from .core import Result, _close, exercise, max_error

# ---- lesson 05: column- and row-parallel Linear as autograd functions ----


def tp_problem():
    """A Hypothesis strategy of the TP MLP's problem: an odd hidden size that is a multiple of 3 (so the 4x hidden
    units split over 2, 3 and 4 ranks), any batch and sequence length, a secret seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            hidden=st.sampled_from((3, 9, 15, 21)),
            batch=st.integers(1, 3),
            seq=st.integers(1, 5),
            seed=st.integers(0, 2**31 - 1),
        )
    )


def _tp_problem(tp: dict):
    import torch

    from ..models import FeedForward

    torch.manual_seed(tp["seed"])
    dense = FeedForward(tp["hidden"])
    x = torch.randn(tp["batch"], tp["seq"], tp["hidden"])
    weights = torch.linspace(-1, 1, tp["batch"] * tp["seq"] * tp["hidden"]).view_as(x)
    return dense, x, weights


def _tp_reference(tp: dict):
    dense, x, weights = _tp_problem(tp)
    x.requires_grad_()
    y = dense(x)
    (y * weights).sum().backward()
    return dict(
        y=y.detach(),
        x_grad=x.grad,
        w1=dense.fc1.weight.grad,
        b1=dense.fc1.bias.grad,
        w2=dense.fc2.weight.grad,
        b2=dense.fc2.bias.grad,
        b2_value=dense.fc2.bias.detach(),
    )


def _tp_harness(answer, tp):
    import torch
    import torch.distributed as dist

    column, row = answer
    rank, t = dist.get_rank(), dist.get_world_size()
    dense, x, weights = _tp_problem(tp)
    n = dense.fc1.out_features // t
    rows = slice(rank * n, (rank + 1) * n)
    w1 = dense.fc1.weight[rows].detach().clone().requires_grad_()
    b1 = dense.fc1.bias[rows].detach().clone().requires_grad_()
    w2 = dense.fc2.weight[:, rows].detach().clone().requires_grad_()
    b2 = dense.fc2.bias.detach().clone().requires_grad_()
    x.requires_grad_()
    from .contracts import recorder

    with recorder() as forward:  # the grader's record at the dispatcher: aliases and other collectives included
        y = row.apply(torch.nn.functional.gelu(column.apply(x, w1, b1)), w2, b2)
    with recorder() as backward:
        (y * weights).sum().backward()
    fwd, bwd = forward.collectives, backward.collectives
    return dict(
        y=y.detach(),
        x_grad=x.grad,
        w1=w1.grad,
        b1=b1.grad,
        w2=w2.grad,
        b2=b2.grad,
        forward_calls=len(fwd),
        backward_calls=len(bwd),
        ops=(tuple(fwd), tuple(bwd)),
        rank=rank,
        rows=(rows.start, rows.stop),
    )


def _tp_wrong(outs, ref) -> str:
    """What the layers get wrong (output, dL/dx, weight gradients), "" where they are right."""
    wrong = []
    if not all(_close(o["y"], ref["y"]) for o in outs):
        wrong.append("output max error %.2g" % max(max_error(o["y"], ref["y"]) for o in outs))
    if not all(_close(o["x_grad"], ref["x_grad"]) for o in outs):
        wrong.append("dL/dx max error %.2g" % max(max_error(o["x_grad"], ref["x_grad"]) for o in outs))
    for o in outs:
        rows = slice(*o["rows"])
        want = dict(w1=ref["w1"][rows], b1=ref["b1"][rows], w2=ref["w2"][:, rows], b2=ref["b2"])
        bad = [k for k, v in want.items() if o[k] is None or not _close(o[k], v)]
        if bad:
            wrong.append(f"rank {o['rank']}'s gradients of {', '.join(bad)} wrong")
            break
    return "; ".join(wrong)


def _tp_smallest(grader, answer, tp: dict, world_size: int, passed: list) -> str:
    """The hint's words for the smallest failing instance Hypothesis finds below the drawn one (fewer ranks where
    the answer was not right with them, a narrower MLP, a shorter batch and sequence)."""
    from .instances import around, shrink, smallest_words

    first = dict(tp, world=world_size)
    sizes = dict(
        world=tuple(w for w in (2, 3, 4) if w <= world_size and w not in passed) or (world_size,),
        hidden=(3, 9, 15, 21),
        batch=1,
        seq=1,
    )

    def differs(i):
        p = {k: v for k, v in i.items() if k != "world"}
        outs = grader.run(i["world"], _tp_harness, answer, p, what=f"your layers on {i['world']} ranks")
        return _tp_wrong(outs, _tp_reference(p))

    def words(i):
        return f"{i['world']} ranks, hidden {i['hidden']} ({4 * i['hidden']} units split), batch {i['batch']}, sequence {i['seq']}"

    small, what = shrink(around(first, sizes), differs, first, grader)
    return smallest_words(small, what, words) if small != first else ""


@exercise("tp_linear")
def _check_tp_linear(answer, grader):
    from .instances import draw

    tp = draw(tp_problem(), 1)[0]  # drawn now, from the OS's randomness
    ref = _tp_reference(tp)
    passed, smallest = [], None
    for world_size in (2, 3, 4):  # 3: not a power of two
        outs = grader.run(world_size, _tp_harness, answer, tp, what=f"your layers on {world_size} ranks")
        if smallest is None and _tp_wrong(outs, ref):  # once: the smallest instance that fails, for the hint
            smallest = _tp_smallest(grader, answer, tp, world_size, passed)
        passed += [] if _tp_wrong(outs, ref) else [world_size]
        ok_y = all(_close(o["y"], ref["y"]) for o in outs)
        hint = ""
        if not ok_y:
            if all(_close(o["y"], ref["y"] + (world_size - 1) * ref["b2_value"]) for o in outs):
                hint = (
                    f"the bias of the row-parallel layer was added {world_size} times: every rank added it before "
                    "the all-reduce. Add it once, after the all-reduce"
                )
            elif sum(o["forward_calls"] for o in outs) == 0:
                hint = (
                    "each rank's row-parallel product x_r @ w_r.T is only a partial sum over its slice of the "
                    "input features: all-reduce it in forward (Megatron's g)"
                )
            else:
                hint = (
                    "column-parallel forward is local (y_r = x @ w_r.T + b_r); the row-parallel output is all-reduced"
                )
        yield Result(
            f"{world_size} ranks: output equal to the unsplit MLP",
            ok_y,
            hint + ((smallest or "") if not ok_y else ""),
            "" if ok_y else "max error %.2g" % max(max_error(o["y"], ref["y"]) for o in outs),
        )
        ok_x = all(_close(o["x_grad"], ref["x_grad"]) for o in outs)
        yield Result(
            f"{world_size} ranks: dL/dx equal to the unsplit MLP",
            ok_x,
            ""
            if ok_x
            else "in the column-parallel backward, grad_y_r @ w_r is only this rank's share of "
            "dL/dx (its slice of output features): all-reduce it (Megatron's f)" + (smallest or ""),
            "" if ok_x else "max error %.2g" % max(max_error(o["x_grad"], ref["x_grad"]) for o in outs),
        )
        ok_w = True
        for o in outs:
            rows = slice(*o["rows"])
            want = dict(w1=ref["w1"][rows], b1=ref["b1"][rows], w2=ref["w2"][:, rows], b2=ref["b2"])
            ok_w &= all(o[k] is not None and _close(o[k], v) for k, v in want.items())
        yield Result(
            f"{world_size} ranks: weight gradients equal the slices of the unsplit ones",
            ok_w,
            ""
            if ok_w
            else "weight gradients are local: grad_w = grad_y^T @ x on this rank's slice, and "
            "grad_b = grad_y summed over batch and sequence; no all-reduce for them" + (smallest or ""),
        )
        counts = {o["ops"] for o in outs}
        ok_c = counts == {(("all_reduce",), ("all_reduce",))}
        yield Result(
            f"{world_size} ranks: one all-reduce in forward, one in backward",
            ok_c,
            ""
            if ok_c
            else "the Megatron MLP needs exactly one all-reduce each way: the row-parallel output "
            "in forward, the column-parallel input gradient in backward",
            "" if ok_c else f"(forward, backward) collectives per rank: {sorted(counts)}",
        )
