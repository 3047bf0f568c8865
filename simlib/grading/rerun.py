"""The milestones' re-run: a few steps of the claimed plan on the grader's own workers, compared with the record.

A run record is the learner's word for the plan and the time. The grader checks it the only way that does not take
that word: it runs the course's own trainer (:func:`simlib.train.train`) with the claimed plan on its own 2 worker
processes, from the project's seeded model (the record's step 0, checked by :mod:`.evidence`), for the first steps
of the standard run (up to the record's first logged step after 0, at least :data:`MIN_STEPS`), with the standard
optimizer and its full-budget schedule, and the record's torch threads per rank. Then:

- **losses**: every loss the record logged in those steps equals the re-run's within :data:`PLAN_RTOL` on the CPU:
  the same plan reproduces its losses bit for bit, while another plan (or one process) rounds its sums in another
  order and lands 4e-8 to 2e-7 away, so a relabelled run shows here; on a GPU within :data:`LOSS_RTOL` (another
  learning rate, batch, optimizer or data in the first steps shows);
- **spans**: the record's steps carry every kind of span (forward, backward, comm, optimizer) that each step of
  the claimed plan makes here (a one-process run has no ``comm``);
- **time**: the record's median step time over the re-run's median step time of the same plan, ``q``. Load slows
  every plan alike, so ``q`` of each plan is compared with the median ``q`` of the other plans re-run in the same
  check (within :data:`RELATIVE_TOL`, both ways: a rival made to look slower fails too). Alone (vision, finance:
  one plan), the record's median step may be at most :data:`ABSOLUTE_TOL` times faster than the re-run's fastest
  step: one-sided (a slower record gains nothing) and against the fastest step (the least disturbed by load),
  scaled to idle cores by the slowdown :mod:`simlib.pace` measures right after the re-run (a record made on a
  quieter machine is not failed by a busy one; the price: an edit hides in the slowdown as well).

What this cannot tell apart: on a GPU, plans whose step times here differ by less than the tolerance (their losses
agree to LOSS_RTOL: the same mathematics); anywhere, step times edited by less than the tolerances (about 5x relative,
2.5x absolute under the load measured here) and a run that follows the standard settings for the re-run's steps and
deviates after. The measurements the tolerances come from are in the comments beside them.
"""

from __future__ import annotations

import statistics

from .. import pace
from .core import Result

MIN_STEPS = 8  # steps re-run at least: 6 timed steps after the trainer's 2 warm-up steps
WARMUP = 2  # steps 0 and 1 are left out of every step time (first-call costs, the profiled step)
# Losses. Measured here (GPT quick, 10 steps, 2 Gloo ranks, 1 thread each, load 4-6): the record and the re-run of
# the same plan were bitwise equal at every step (dp, dp+acc, tp, pp); two plans differed by 4e-8 (tp) to 2e-7 (pp)
# relative, a one-process run from dp by 1e-7: rounding is the plan's fingerprint. On the CPU (deterministic kernels,
# the record's thread count reproduced) the check allows PLAN_RTOL, 40x below the closest two plans; on a GPU
# (kernels that need not be deterministic) LOSS_RTOL, which still catches another learning rate, batch or data.
PLAN_RTOL = 1e-9
LOSS_RTOL = 1e-4
# Time. Measured in the same session (3 rounds of re-runs of each plan; record medians over 8 steps): the record's
# median over the re-run's, q, spread 1.5-2.9x per plan between rounds, and q of a plan over the median q of the
# others ranged 0.32-3.33 for honest runs (load 4-6 on 2 cores from other sessions; steps of 20-100 ms). The
# tolerances are 1.5x the largest seen: what an honest run under such load needs. Only gross edits (about 5x) and
# plans that far apart are caught by time: the plan itself is told by its losses' rounding (above).
RELATIVE_TOL = 5.0  # q of a plan / median q of the other plans re-run in the same check, both ways
ABSOLUTE_TOL = 2.5  # record's median step at most this much faster than the re-run's fastest (seen: 1.56).
# Load at the run that the check does not share widens it: at load ~19 on 2 cores a finance
# record (steps of a few ms) edited 10x faster passed; a time check alone is weak there


def replay_steps(rows, budget: int) -> int:
    """How many steps to re-run: through the first logged step after 0, at least MIN_STEPS, within the budget."""
    logged = sorted(r["step"] for r in rows if isinstance(r.get("step"), int) and r["step"] > 0)
    return max(1, min(budget, max(MIN_STEPS, (logged[0] + 1) if logged else MIN_STEPS)))


def _replay(task, plan, optim, steps, threads, pieces=None):
    """One rank of the re-run (the course's own trainer; of the learner's, only ``pieces`` when a pieces milestone
    grades them): its losses, times, spans."""
    import torch

    from ..train import train

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        record = train(
            task,
            plan,
            steps=steps,
            optim=optim,
            eval_every=0,
            log_every=1,
            verbose=False,
            measure_memory=False,
            warmup=WARMUP,
            pieces=pieces,
        )
    finally:
        torch.set_num_threads(before)
    return {
        "losses": {r["step"]: float(r["loss"]) for r in record.rows},
        "step_times": [float(r["step_time"]) for r in record.rows if r["step"] >= WARMUP],
        # the kinds of work every timed step of this plan does (a kind some steps lack, e.g. a wait, is left out)
        "spans": sorted(
            set.intersection(*[set(r.get("spans", {})) for r in record.rows if r["step"] >= WARMUP] or [set()])
        ),
    }


def _cluster_for(grader, device, world_size: int):
    """The grader's workers on the kind of device the record says it ran on: its own CPU cluster, or (a record
    made on GPUs) ranks placed as the notebooks place them (``placement``), kept with the grader's clusters."""
    from . import core

    if not str(device).startswith("cuda"):
        return grader.cluster(world_size)
    from ..launch import Cluster
    from ..lessons.scaling import placement

    where = placement((1, 2, 4))
    if where.kind == "cpu":
        raise core._Stop(
            Result(
                f"the record's device ({device}) is on this machine",
                False,
                "the record says its ranks ran on a GPU and this machine has none: run the plans on "
                "the machine that grades them (the check re-runs them to time them)",
            )
        )
    key = ("placement", where.kind, world_size)
    if key not in core._clusters:  # closed by grading.close() with the others
        core._clusters[key] = Cluster(world_size, threads=1, timeout=60, **where.launch_kwargs)
    return core._clusters[key]


def replay(
    grader, task, plan, optim, budget: int, rows, threads: int, device: str = "cpu", timeout: float = 300.0
) -> dict:
    """Re-run the first steps of ``plan`` on the grader's 2 workers -> rank 0's {losses, step_times, spans}."""
    import dataclasses

    from .core import Grader

    grader = grader if grader is not None else Grader()
    optim = dataclasses.replace(optim, decay_steps=optim.decay_steps or budget)  # the full run's schedule
    cluster = _cluster_for(grader, device, plan.world_size)
    args = (task, plan, optim, replay_steps(rows, budget), threads)
    out = call_with_pieces(grader, cluster, _replay, args, timeout)[0]  # plain data back
    # how much slower than idle cores this machine runs work now, measured right after the re-run (issue 51: the
    # burner run's vision record, made at a lower load, looked 2.9x "too fast" against a re-run at load ~20)
    now = pace.pace(refresh=True)  # and the limits that read the calibration see it too
    return {**out, "slowdown": now.slowdown, "load": now.note()}


def call_with_pieces(grader, cluster, fn, args, timeout):
    """``fn(*args)`` on every rank of ``cluster`` (plain data back); when the grader grades a pieces milestone
    (``grader.pieces_from``: the answer, still bytes), ``fn(*args, pieces=<the answer's pieces>)``, the answer
    opened only in the workers, under the guard every learner's code runs under."""
    answer = getattr(grader, "pieces_from", None)
    if answer is None:
        return cluster.call(fn, args, timeout=timeout, plain=True)
    from .pieces_milestone import run_with_answer_pieces
    from .sent import _guarded

    return cluster.call(_guarded, (run_with_answer_pieces, (answer, fn, args), {}), timeout=timeout, plain=True)


def record_threads(summary) -> int:
    """The torch threads per rank the record says it ran with (1 when it says nothing usable)."""
    t = summary.get("threads")
    return t if isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 256 else 1


def record_step_time(rows) -> float | None:
    """Median of the record's logged step times after the warm-up steps."""
    times = [r.get("step_time") for r in rows if isinstance(r.get("step"), int) and r["step"] >= WARMUP]
    times = [t for t in times if isinstance(t, (int, float)) and t > 0]
    return statistics.median(times) if times else None


def check_losses(name: str, rows, replayed: dict, what: str, device: str = "cpu") -> Result:
    """Every loss the record logged in the re-run's steps against the re-run's: to PLAN_RTOL on the CPU (the
    plan's rounding), to LOSS_RTOL on a GPU."""
    mine = replayed["losses"]
    rtol = LOSS_RTOL if str(device).startswith("cuda") else PLAN_RTOL
    pairs = [
        (r["step"], r.get("loss"), mine[r["step"]])
        for r in rows
        if isinstance(r.get("step"), int) and r["step"] in mine
    ]
    bad = [
        (s, got, want)
        for s, got, want in pairs
        if not isinstance(got, (int, float)) or abs(got - want) > rtol * abs(want)
    ]
    rounding = bad and all(isinstance(g, (int, float)) and abs(g - w) <= LOSS_RTOL * abs(w) for _, g, w in bad)
    ok = bool(pairs) and not bad
    return Result(
        f"{name}: the first {len(mine)} steps re-run here give the record's losses",
        ok,
        (
            f"the record's losses differ from {what}'s re-run here only in rounding: the run was another plan "
            "(each plan rounds its sums in its own order) relabelled as this one. Rerun the plan itself"
            if rounding
            else f"the grader re-ran the first steps of {what} on its own 2 processes from the project's seeded "
            "model, with the project's optimizer and batches: the record's losses are not those. The run "
            "trained with other settings (learning rate, batch, data), or the record was edited: rerun the "
            "project's standard run"
        ),
        f"allowed {rtol:g} relative; "
        + "; ".join(f"step {s}: recorded {g!r}, re-run {w!r}" for s, g, w in (bad or pairs)[:3]),
    )


def check_spans(name: str, rows, replayed: dict, what: str) -> Result:
    """The record's steps carry every kind of span the claimed plan makes in each of its steps here."""
    recorded = sorted(
        {k for r in rows if isinstance(r.get("step"), int) and r["step"] >= WARMUP for k in (r.get("spans") or {})}
    )
    ok = set(replayed["spans"]) <= set(recorded)
    return Result(
        f"{name}: the record's steps show the work of {what} (forward, backward, communication)",
        ok,
        f"the record's per-step spans are not those {what} makes when the grader runs it: a run of "
        "another plan (one process has no communication) was relabelled. Rerun the plan itself",
        f"recorded {recorded}, re-run {replayed['spans']}",
    )


def time_ratio(rows, replayed: dict) -> tuple | None:
    """(q, q_best, load): the record's median step time over the re-run's median, and over the re-run's fastest step
    as it would run on idle cores (divided by the slowdown measured after the re-run: a busy machine's re-run is not
    held against a record made when it was quieter), and what was measured (None when either has no step time)."""
    mine = replayed["step_times"]
    theirs = record_step_time(rows)
    if not mine or not theirs:
        return None
    slowdown = max(1.0, float(replayed.get("slowdown", 1.0)))
    return theirs / statistics.median(mine), theirs / (min(mine) / slowdown), replayed.get("load", "")


def check_time(name: str, ratio: tuple | None, others: dict, what: str) -> Result:
    """The record's steps no faster than the re-run's fastest step by more than ABSOLUTE_TOL, and q within
    RELATIVE_TOL of the median q of the other plans re-run in the same check."""
    problems = []
    qs = {k: v[0] for k, v in others.items() if v is not None}
    if ratio is None:
        problems.append("the record has no step times after the warm-up")
    else:
        q, best, *load = ratio
        if best < 1 / ABSOLUTE_TOL:
            said = f" ({load[0]})" if load and load[0] else ""
            problems.append(f"its median step took {best:.2f}x the fastest step of {what} here{said}")
        if qs:
            ref = statistics.median(qs.values())
            if not 1 / RELATIVE_TOL <= q / ref <= RELATIVE_TOL:
                problems.append(f"recorded / re-run step time {q:.2f} against {ref:.2f} for the other plans")
    others_text = f" (other plans: {', '.join(f'{k} {v:.2f}' for k, v in qs.items())})" if qs else ""
    detail = "; ".join(problems) or f"recorded / re-run step time {ratio[0]:.2f}"
    return Result(
        f"{name}: the record's step time is what {what} takes on this machine",
        not problems,
        f"the grader timed the first steps of {what} on its own processes: the record's step times do "
        f"not fit (a median step at most {ABSOLUTE_TOL:g}x faster than the fastest step here, and within "
        f"{RELATIVE_TOL:g}x of the other plans' ratio). The times were edited or another plan ran under "
        "this name: rerun it. (If this machine is much busier now than when the runs were made, the "
        "re-run is slower: check again when it is quieter.)",
        detail + others_text,
    )
