"""Checks for lessons 04-05: the 1F1B schedule, a pipeline stage with send/recv, tensor-parallel Linear."""

from __future__ import annotations

from .core import Result, _close, exercise, max_error
from .pipeline_problems import _pp_draw, _pp_problem, _pp_reference, _pp_size, pp_problem  # noqa: F401

# ---- lesson 04: the 1F1B schedule, and a pipeline stage's forward/backward with send/recv ----


# 5: stages of unequal depth other than 3's (a pipeline of 5 to 8 blocks), a fifth cluster's start costs a fraction of a
# second now that workers fork from a warm zygote (it cost over +30 % of the check when each imported torch)
_PP_WORLDS = (2, 3, 4, 5)


def _learner_order(answer, rank, p, m):
    """The learner's compute order as (op, microbatch) pairs of exact types (Actions or tuples accepted)."""
    from ..plain import exact_str

    out = []
    for a in answer(rank, p, m):
        op, mb = (a.op, a.microbatch) if hasattr(a, "op") else (a[0], a[1])
        out.append((exact_str(op), int.__int__(int(mb))))
    return out


def _orders_harness(answer, sizes):
    """In a worker (the answer runs there, never in the grading process): every rank's order for each size, with
    the library's own 1F1B and GPipe schedules switched off (an answer that returns them proves nothing)."""
    from ..parallel import schedules
    from .contracts import switched_off

    with switched_off(schedules.one_f_one_b, schedules.gpipe):
        return [(p, m, [_learner_order(answer, r, p, m) for r in range(p)]) for p, m in sizes]


def _schedule_from_orders(orders):
    from ..parallel.schedules import with_communication

    p = len(orders)
    return [with_communication(r, p, [(op, mb, 0) for op, mb in order]) for r, order in enumerate(orders)]


def _pp_harness(orders, pp):
    import torch.distributed as dist

    from ..parallel import pipeline

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = _pp_problem(pp)
    stages = pipeline.build_stages(model.net, rank, world_size)
    out = pipeline.pipeline_step(
        _schedule_from_orders(orders),
        stages,
        x,
        y,
        num_microbatches=pp["num_microbatches"],
        activation_width=pp["width"],
    )
    return dict(loss=out["loss"], grads={n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def _grads_by_rank(outs, ref_grads):
    """Per rank: None if its stage's gradients equal the reference's, else the largest error."""
    errors = []
    for out in outs:
        got = out["grads"]
        if not got or any(n not in ref_grads for n in got):
            errors.append(float("inf"))
            continue
        bad = [max_error(g, ref_grads[n]) for n, g in got.items() if not _close(g, ref_grads[n])]
        errors.append(max(bad) if bad else None)
    return errors


@exercise("one_f_one_b")
def _check_one_f_one_b(answer, grader):
    from hypothesis import strategies as st

    from ..parallel import schedules

    # the lesson's sizes, and two drawn now (5 to 8 stages, 5 to 16 micro-batches): a table of the first cannot
    # pass; and the problem the schedule runs on for real
    sizes = [(p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 8)]
    bigger = st.lists(st.tuples(st.integers(5, 8), st.integers(5, 16)), min_size=2, max_size=2)
    more, pp = _pp_draw(bigger)
    sizes += more
    m = pp["num_microbatches"]
    sizes += [(p, m) for p in _PP_WORLDS if (p, m) not in sizes]
    orders = {(p, m): o for p, m, o in grader.ask(_orders_harness, answer, sizes, what="your schedule function")}
    want = {
        (p, m): [[(a.op, a.microbatch) for a in schedules.compute_order(acts)] for acts in schedules.one_f_one_b(p, m)]
        for p, m in sizes
    }
    # 1. every forward and backward exactly once, backward after forward
    bad = next(
        ((p, m, r) for (p, m), o in orders.items() for r in range(p) if sorted(o[r]) != sorted(want[p, m][r])), None
    )
    yield Result(
        "every rank runs each micro-batch's forward and backward exactly once",
        bad is None,
        "return one ('forward', i) and one ('backward', i) per micro-batch i in range(num_microbatches)",
        "" if bad is None else "p=%d, m=%d, rank %d returned %s" % (bad[0], bad[1], bad[2], orders[bad[:2]][bad[2]]),
    )
    if bad is not None:
        return
    late = next(
        (
            (p, m, r)
            for (p, m), o in orders.items()
            for r in range(p)
            if any(o[r].index(("backward", i)) < o[r].index(("forward", i)) for i in range(m))
        ),
        None,
    )
    yield Result(
        "each backward comes after its forward",
        late is None,
        "a micro-batch's backward needs the activations its forward saved",
        "" if late is None else "p=%d, m=%d, rank %d" % late,
    )
    if late is not None:
        return
    # 2. deadlock-free with blocking receives
    stuck = None
    for (p, m), o in orders.items():
        try:
            schedules.check(_schedule_from_orders(o))
        except ValueError as exc:
            stuck = (p, m, str(exc))
            break
    yield Result(
        "the schedule cannot deadlock (receives block, sends do not)",
        stuck is None,
        "a rank waits for a gradient its neighbour can only send later. Rank r may run at most "
        "p - r - 1 forwards (its warm-up) before it must run its first backward",
        "" if stuck is None else "p=%d, m=%d: %s" % stuck,
    )
    if stuck is not None:
        return
    # 3. 1F1B's memory bound: rank r holds at most p - r micro-batches' activations
    over = next(
        (
            (p, m, r, schedules.peak_activations(_schedule_from_orders(o))[r])
            for (p, m), o in orders.items()
            for r in range(p)
            if schedules.peak_activations(_schedule_from_orders(o))[r] > min(p - r, m)
        ),
        None,
    )
    gpipe_like = over is not None and orders[over[:2]][over[2]] == [("forward", i) for i in range(over[1])] + [
        ("backward", i) for i in reversed(range(over[1]))
    ]
    yield Result(
        "at most p - rank micro-batches in flight on each rank (1F1B's memory bound)",
        over is None,
        "this is GPipe's order (all forwards, then all backwards): start backwards after the warm-up"
        if gpipe_like
        else "too many forwards before the first backward: the warm-up of rank r is "
        "p - r - 1 forwards, then alternate one forward and one backward",
        "" if over is None else "p=%d, m=%d, rank %d holds %d" % over,
    )
    # 4. the exact 1F1B order
    diff = next(((p, m, r) for (p, m), o in orders.items() for r in range(p) if o[r] != want[p, m][r]), None)
    hint = ""
    if diff is not None:
        p, m, r = diff
        got, exp = orders[p, m][r], want[p, m][r]
        i = next(k for k in range(len(exp)) if got[k] != exp[k])
        hint = (
            f"p={p}, m={m}, rank {r}: action {i} is {got[i]}, 1F1B has {exp[i]}. The warm-up is "
            "min(p - rank - 1, m) forwards; then for each remaining micro-batch one forward and the "
            "oldest backward; the cool-down runs the remaining backwards oldest first"
        )
    yield Result("the order equals 1F1B on every rank (p = 1..4, m = 1..8)", diff is None, hint)
    # 5. for real: 2 to 5 ranks, gradients equal one process, on the drawn problem (m again: loops above set it)
    _, ref_grads, m = *_pp_reference(pp), pp["num_microbatches"]
    for p in _PP_WORLDS:
        outs = grader.run(p, _pp_harness, orders[p, m], pp, what=f"the schedule on {p} ranks")
        errors = _grads_by_rank(outs, ref_grads)
        yield Result(
            f"run on {p} ranks by simlib's executor ({_pp_size(pp)}): gradients equal one process",
            all(e is None for e in errors),
            "the executor runs your order; compare it with the lesson's 1F1B table",
            "" if all(e is None for e in errors) else f"max errors by rank {errors}",
        )


def _stage_differs(grader, answer, world: int, pp: dict) -> str:
    """What the stage gets wrong on ``world`` ranks and problem ``pp`` ("" where it is right): for the shrinking."""
    ref_loss, ref_grads = _pp_reference(pp)
    outs = grader.run(world, _stage_harness, answer, pp, what=f"your stage on {world} ranks")
    last = outs[-1]["loss"]
    errors = _grads_by_rank(outs, ref_grads)
    wrong = [r for r, e in enumerate(errors) if e is not None]
    if last is None or abs(last - ref_loss) > 1e-5 * max(1.0, abs(ref_loss)):
        return f"the last stage returned the loss {last}, want {ref_loss:.6f}" + (
            f"; gradients wrong on rank(s) {wrong}" if wrong else ""
        )
    return f"gradients wrong on rank(s) {wrong}" if wrong else ""


def _stage_smallest(grader, answer, pp: dict, world_size: int, passed: list) -> str:
    """The hint's words for the smallest failing instance Hypothesis finds below the drawn one (fewer ranks where
    the answer was not right with them, fewer and narrower blocks, fewer and smaller micro-batches)."""
    from .instances import around, shrink, smallest_words

    first = {k: v for k, v in pp.items() if k != "batch"}
    first["world"] = world_size
    sizes = dict(
        world=tuple(w for w in _PP_WORLDS if w <= world_size and w not in passed) or (world_size,),
        width=4,
        depth=4,  # 5 blocks: one for each of 5 stages
        in_features=2,
        out_features=1,
        microbatch=1,
        num_microbatches=2,
    )
    strategy = around(
        first, sizes, keep=lambda i: i["microbatch"] != i["num_microbatches"] and i["in_features"] != i["width"]
    )

    def problem(i):
        return dict({k: v for k, v in i.items() if k != "world"}, batch=i["microbatch"] * i["num_microbatches"])

    def words(i):
        return f"{i['world']} ranks, {_pp_size(problem(i))}, {i['in_features']} inputs, {i['out_features']} outputs"

    small, what = shrink(strategy, lambda i: _stage_differs(grader, answer, i["world"], problem(i)), first, grader)
    return smallest_words(small, what, words) if small != first else ""


def _stage_harness(answer, pp):
    import torch.distributed as dist

    from ..parallel import pipeline
    from ..parallel.pipeline import microbatches

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = _pp_problem(pp)
    stage = pipeline.build_stages(model.net, rank, world_size)[0]
    m = pp["num_microbatches"]
    xs, ys = microbatches(x, m), microbatches(y, m)
    from .contracts import recorder

    with recorder() as rec:  # the grader's: the order of the messages this stage really sent and received
        loss = answer(stage, xs, ys, (xs[0].shape[0], pp["width"]))
    loss = float(loss) if loss is not None else None
    # F: an activation (from rank - 1, to rank + 1); B: a gradient (from rank + 1, to rank - 1)
    order = "".join(
        "F" if (c["op"], c["peer"]) in (("recv", rank - 1), ("send", rank + 1)) else "B"
        for c in rec.calls
        if c["op"] in ("send", "recv")
    )
    return dict(
        loss=loss, grads={n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, order=order
    )


@exercise("pipeline_stage")
def _check_pipeline_stage(answer, grader):
    pp = _pp_draw()
    ref_loss, ref_grads = _pp_reference(pp)
    m = pp["num_microbatches"]
    scaled = {n: g * m for n, g in ref_grads.items()}
    passed, smallest = [], None
    for world_size in _PP_WORLDS:  # 3: stages of unequal depth, a middle stage that is neither first nor last
        # on 3 ranks (a first, a middle and a last stage) what crossed is also read from the kernel
        outs = grader.run(
            world_size, _stage_harness, answer, pp, what=f"your stage on {world_size} ranks", wire=world_size == 3
        )
        on_wire = grader.wire_last
        last = outs[-1]["loss"]
        ok_loss = last is not None and abs(last - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
        errors = _grads_by_rank(outs, ref_grads)
        ok = all(e is None for e in errors)
        if smallest is None and not (ok and ok_loss):  # once: the smallest instance that fails, for the hint
            smallest = _stage_smallest(grader, answer, pp, world_size, passed)
        yield Result(
            f"{world_size} ranks ({_pp_size(pp)}): the last stage returns the batch loss",
            ok_loss,
            f"return the sum over micro-batches of loss_i / {m} (the mean over micro-batches) on the last "
            "stage"
            + (f"; yours is {last / ref_loss:.3g}x the right one" if last and ref_loss else "")
            + ((smallest or "") if not ok_loss else ""),
            "" if ok_loss else f"got {last}, want {ref_loss:.6f}",
        )
        passed += [world_size] if ok and ok_loss else []
        hint, wrong = "", [r for r, e in enumerate(errors) if e is not None]
        if not ok:
            if all(e is None for e in _grads_by_rank(outs, scaled)):
                hint = (
                    f"your gradients are {m}x the right ones: divide each micro-batch's loss by the number of "
                    f"micro-batches ({m}) so that they add up to the whole batch's mean"
                )
            elif errors[-1] is None and (world_size < 3 or errors[-2] is not None):
                hint = (
                    "the last stage is right but the stage before it is wrong: a stage that is not last must run "
                    "backward from its output with the gradient it received, torch.autograd.backward(y, grad) "
                    "(y.backward(grad)), not from a sum of its output"
                )
            elif errors[-1] is None and errors[-2] is None:
                hint = (
                    "the last two stages are right, earlier ones wrong: what you send back must be the gradient "
                    "with respect to this stage's *input*, x.grad (x received with requires_grad), not the "
                    "gradient you received"
                )
            else:
                hint = (
                    "compare your steps with the recipe: recv x (requires_grad), y = stage(x), send y.detach(); "
                    "then in reverse: recv grad, y.backward(grad), send x.grad"
                )
        yield Result(
            f"{world_size} ranks ({_pp_size(pp)}): every stage's gradients equal one process on the whole batch",
            ok,
            hint + ((smallest or "") if not ok else ""),
            "" if ok else f"wrong on rank(s) {wrong}",
        )
        # the schedule the stages really ran, from the grader's record of their messages: GPipe is every
        # micro-batch's activation first, then every gradient
        late = next((r for r, o in enumerate(outs) if "BF" in o["order"] or "F" not in o["order"]), None)
        yield Result(
            f"{world_size} ranks: GPipe's schedule (all {m} forwards' messages, then all backwards')",
            late is None,
            "the exercise is GPipe's schedule: run the forward of every micro-batch first (receive, compute, "
            "send each activation), then the backwards in reverse order. A backward right after its own "
            "forward gives the same gradients with no pipelining: each stage waits for the whole pipeline "
            "on every micro-batch",
            ""
            if late is None
            else f"rank {late}'s messages in order (F activation, B gradient): {outs[late]['order']}",
        )
        if on_wire is not None:  # every micro-batch's float32 activation forward, its gradient back
            from .wire import flow_breach

            flow = m * pp["microbatch"] * pp["width"] * 4
            need = {(r, r + d): flow for r in range(world_size) for d in (1, -1) if 0 <= r + d < world_size}
            breach = flow_breach(on_wire, need, "activations (to the next stage) and gradients (to the one before)")
            yield Result(
                f"{world_size} ranks: on the wire (the kernel's TCP counters, outside your process), activations "
                "go to the next stage and gradients to the one before, nothing else",
                not breach,
                "what your stages sent each other was counted by the operating system, below every Python name: "
                "stage r sends each micro-batch's activation to r + 1 and the gradient of its input to r - 1",
                breach,
            )


from . import tensor_parallel  # noqa: E402, F401 - lesson 05's tp_linear (registers its check)
