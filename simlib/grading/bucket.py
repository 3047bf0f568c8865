"""Checks for lesson 02's bucketed data parallelism: gradients, one all-reduce per bucket, and the overlap of
each bucket's all-reduce with the backward of later layers, read from the timeline."""

from __future__ import annotations

from .core import Result, exercise
from .dp_common import (
    _DP_LR,
    _DP_STEPS,
    _WORLD_SIZES,
    _check_training,
    _diagnose_grads,
    _draw_problem,
    _my_shard,
    _reference,
    _tiny_problem,
    dp_shrunk,
    only_some_sizes,
)

# ---- lesson 02: bucketed data parallelism with gradient hooks ----


def _bucket_cap(problem: dict) -> float:
    """A bucket cap (MB) drawn now for the drawn problem: between its largest parameter and twice that, lowered
    until the parameters fall into at least three buckets (so a bucket has later layers to overlap with)."""
    from ..parallel.data import make_buckets
    from .instances import entropy

    model, _, _ = _tiny_problem(problem)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    cap = largest * (1 + entropy().random())
    while len(make_buckets(model.parameters(), cap / 2**20)) < 3 and cap > largest:
        cap = max(largest, cap * 0.8)
    return cap / 2**20


def _bucket_harness(answer_cls, steps, lr, bucket_cap_mb, problem, late, signal=None):
    """The answer's bucketed DDP on the drawn problem, with the timeline the overlap check reads.

    Every all-reduce is recorded at torch's dispatcher (any name or alias), with the time it was issued, and the
    grader's own hooks note when each gradient is ready. In the first step every rank but 0 is ``late`` seconds
    late into its backward (a slow peer, made by the grader), counted from the moment rank 0 issues its first
    all-reduce (rank 0 touches the file ``signal``; the others wait for it, at most 2 s, before their delay: a
    rank 0 that is itself behind, on a busy machine or in a fresh process, cannot absorb the delay). Rank 0's first
    bucket cannot finish before then, so if rank 0's next gradient is ready before the late peer wakes (the times
    compared on the machine's one monotonic clock), the communication overlapped the backward of later layers; if
    it waited on the all-reduce (a blocking call under any name, or a wait right after it), the next gradient comes
    only after the peer joined. An extra async all-reduce of something else changes nothing here."""
    import os
    import time

    import torch
    import torch.distributed as dist

    from ..parallel.data import make_buckets
    from .contracts import recorder

    model, x, y = _tiny_problem(problem)
    xs, ys = _my_shard(x, y)
    rank = dist.get_rank()
    expected_buckets = len(make_buckets(model.parameters(), bucket_cap_mb))
    state = dict(step=-1, backward=False, slept=False)
    ready, issued = [], []  # (step, time) of each gradient ready, and (step, time, elements, during backward)

    def on_ready(param):  # registered before the answer's hooks: runs first
        if late and state["step"] == 0 and rank != 0 and not state["slept"]:
            state["slept"] = True
            until = time.perf_counter() + 2.0
            while signal and not os.path.exists(signal) and time.perf_counter() < until:
                time.sleep(0.0005)  # rank 0 has not issued its first all-reduce yet
            time.sleep(late)  # this peer is late: rank 0's first all-reduce waits for it
            state["joined"] = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process of this machine
        ready.append((state["step"], time.perf_counter()))

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(on_ready)

    def watch(name, args):
        if name.startswith("c10d.allreduce"):
            from .contracts import _elements

            issued.append((state["step"], time.perf_counter(), _elements(args), state["backward"]))
            if signal and rank == 0 and state["step"] == 0 and state["backward"] and not os.path.exists(signal):
                open(signal, "w").close()  # the slow peer's delay starts now

    dp = answer_cls(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = None
    with recorder(watch=watch):  # the grader's, at the dispatcher: an alias or distributed_c10d is counted
        for step in range(steps):
            state.update(step=step)
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.mse_loss(dp(xs), ys)
            state.update(backward=True)
            loss.backward()
            state.update(backward=False)
            dp.finish_gradient_synchronization()
            if step == 0:
                grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
    calls = [dict(step=st, during_backward=bw, elements=e) for st, _, e, bw in issued if st >= 0]
    first = [t for st, t, _, bw in issued if st == 0 and bw]
    later = [t for st, t in ready if st == 0 and first and t > first[0]]
    gap = (later[0] - first[0]) if later else None  # from the first all-reduce to the next gradient, step 0
    after = later[0] if later else None  # when that next gradient was ready (perf_counter, this machine's clock)
    return dict(
        grads=grads,
        state=[p.detach().clone() for p in model.parameters()],
        calls=calls,
        expected_buckets=expected_buckets,
        num_params=len(list(model.parameters())),
        gap=gap,
        next_ready=after,
        joined=state.get("joined"),
    )


@exercise("bucket_data_parallel")
def _check_bucket(answer, grader):
    import os
    import shutil
    import tempfile

    problem = _draw_problem(min_depth=2)  # drawn now, from the OS's randomness, no layer dead
    problem["depth"] = max(problem["depth"], 2)  # at least 6 parameters: several buckets under the tiny cap
    ref = _reference(_DP_STEPS, _DP_LR, problem)
    cap_mb = _bucket_cap(problem)
    from .busy import Load

    # the slow peer (on the 2-rank run only): 0.04 s, far above a layer's backward here; a run that looks stalled is
    # run again with the delay scaled by the machine's load before it is judged (a busy machine is not a stall)
    late = 0.04
    passed, timeline, shrunk = [], None, False

    def differs(world, p):  # what the answer gets wrong on (world, p), "" where it is right: for the shrinking
        ref = _reference(_DP_STEPS, _DP_LR, p)
        outs = grader.run(world, _bucket_harness, answer, _DP_STEPS, _DP_LR, _bucket_cap(p), p, 0.0, None)
        ok, detail, _ = _diagnose_grads(outs, ref)
        trained = _check_training(outs, ref, world, _DP_STEPS)
        return (f"gradients: {detail}" if not ok else "") or ("" if trained.passed else f"weights: {trained.detail}")

    folder = tempfile.mkdtemp(prefix="simlib-bucket-")
    signals = iter(os.path.join(folder, f"issued{i}") for i in range(9))  # a fresh file for each timed run
    for world_size in _WORLD_SIZES:
        outs = grader.run(
            world_size,
            _bucket_harness,
            answer,
            _DP_STEPS,
            _DP_LR,
            cap_mb,
            problem,
            late if world_size == 2 else 0.0,
            next(signals) if world_size == 2 else None,
        )
        if world_size == 2:
            timeline = outs
        ok, detail, hint = _diagnose_grads(outs, ref)
        trained = _check_training(
            outs,
            ref,
            world_size,
            _DP_STEPS,
            extra_hint=(
                ". If the first step is right and the second is not: reset the pending counts and handles at the end "
                "of finish_gradient_synchronization, ready for the next backward"
            ),
        )
        smallest = ""
        if not shrunk and not (ok and trained.passed):  # once: the smallest instance that fails, for the hint
            right = tuple(w for w in _WORLD_SIZES if f"{w} ranks" in passed)
            shrunk, smallest = True, dp_shrunk(grader, problem, world_size, differs, min_depth=2, passed=right)
        hint += "" if ok else only_some_sizes(passed, f"{world_size} ranks") + smallest
        trained.hint += smallest if ok else ""
        passed += [f"{world_size} ranks"] if ok else []
        yield Result(
            f"{world_size} ranks: gradients after finish_gradient_synchronization equal the global-batch gradient",
            ok,
            hint,
            detail,
        )
        yield trained
    out = outs[0]
    per_step = [sum(1 for c in out["calls"] if c["step"] == s) for s in range(_DP_STEPS)]
    want = out["expected_buckets"]
    hint = (
        f"{per_step[0]} all-reduces for {out['num_params']} parameters: you sent each gradient on its own. Copy "
        "it into its bucket's buffer and start one all-reduce when the bucket's last gradient has arrived"
        if per_step[0] == out["num_params"]
        else f"expected one all-reduce per bucket ({want}) in every step; the later steps show {per_step[1:]}: reset "
        "the per-bucket state after each step"
        if per_step[0] == want
        else f"expected one all-reduce per bucket ({want} buckets)"
    )
    yield Result(
        "one all_reduce per bucket per step",
        all(n == want for n in per_step),
        hint,
        f"all_reduce calls per step: {per_step}, buckets: {want}",
    )
    calls = timeline[0]["calls"]

    def overlapped_in(run):
        """Rank 0's backward went on (its next gradient was ready) before the late peer had even woken up: its
        first all-reduce could not have finished by then, so the communication overlapped later layers' backward.
        A blocking all-reduce, or a wait on it, returns only after the peer joined: never before, whatever the
        load (causality, not a time limit)."""
        joined = [o["joined"] for o in run[1:] if o.get("joined") is not None]
        return (
            bool(calls)
            and all(c["during_backward"] for c in calls)
            and run[0]["next_ready"] is not None
            and bool(joined)
            and run[0]["next_ready"] < min(joined)
        )

    overlapped = overlapped_in(timeline)
    if not overlapped and calls and all(c["during_backward"] for c in calls):
        late = 0.5 * Load.now(2).factor  # rank 0 may have been off the CPUs for the whole delay: a longer one
        timeline = grader.run(2, _bucket_harness, answer, _DP_STEPS, _DP_LR, cap_mb, problem, late, next(signals))
        overlapped = overlapped_in(timeline)
    shutil.rmtree(folder, ignore_errors=True)
    gap = timeline[0]["gap"]
    if not calls:
        hint = "no all_reduce was called at all"
    elif not all(c["during_backward"] for c in calls):
        hint = (
            "the all-reduces started after backward had finished: start each bucket's all_reduce from the "
            "gradient hook, as soon as the bucket is full, so it overlaps the rest of backward"
        )
    else:
        hint = (
            "the backward stopped until the first bucket's all-reduce was through: pass async_op=True, keep "
            "the handle and wait on it only in finish_gradient_synchronization (a blocking all_reduce in the "
            "hook, or handle.wait() right after it, stalls backward, so nothing overlaps)"
        )
    detail = (
        f"another rank was made {late:.2f} s late from rank 0's first all-reduce; on rank 0 the next gradient came "
        f"{gap:.2f} s after that all-reduce started"
        + ("" if overlapped else ", after the late rank had joined: the backward waited for the all-reduce")
        if gap is not None
        else ""
    )
    yield Result(
        "the first bucket's all-reduce overlaps the backward of later layers (timeline)", overlapped, hint, detail
    )
