"""Replay schedules on the cost model: predicted timelines with the columns of a measured one.

The same values the executors run — gradient buckets (``simlib.parallel.data.make_buckets``) and pipeline
schedules (``simlib.parallel.schedules``: per-rank lists of ``Action``) — are stepped through with predicted
durations instead of real work, so ``simlib.plots.gantt`` draws predicted beside measured.
Execution rule for pipelines (as the executor's): sends never block, a receive waits for its matching send.
"""

from __future__ import annotations

from ..timeline import to_frame
from .cost import stage_times
from .grad_sync import bucket_comm_times, gradient_buckets, optimizer_time
from .topology import p2p_time


def _row(rank, step, kind, name, start, end, warmup):
    return dict(rank=rank, step=step, kind=kind, name=name, start=start, end=end, duration=end - start, warmup=warmup)


def replay_data_parallel(model, hardware, strategy, steps: int = 3, warmup: int = 1, processes=None):
    """Every data-parallel rank alike: micro-batches forward/backward, bucket all-reduces, optimizer.

    With ``strategy.overlap`` bucket i starts when backward of the last micro-batch has produced its share of
    gradients (buckets fill in reverse layer order) and the buckets share one communication channel.
    """

    s = strategy.validate(model=model)
    processes = processes or min(s.world_size, hardware.devices_per_node)
    t_f, t_b = stage_times(model, hardware, s, processes)
    buckets = gradient_buckets(model, s) if s.dp > 1 else []
    comm = bucket_comm_times(model, hardware, s, processes)
    t_opt = optimizer_time(model, hardware, s, processes)
    total = sum(buckets) or 1.0
    rows, t = [], 0.0
    for step in range(steps):
        step_rows, start = [], t
        for mb in range(s.num_micro_batches):
            step_rows.append(("forward", f"forward {mb}", t, t + t_f))
            t += t_f
            step_rows.append(("backward", f"backward {mb}", t, t + t_b))
            t += t_b
        backward_start, channel = t - t_b, t
        if s.overlap:
            channel, filled = backward_start, 0.0
        for i, (size, c) in enumerate(zip(buckets, comm)):
            if s.overlap:
                filled += size
                channel = max(channel, backward_start + t_b * filled / total)
            step_rows.append(("comm", f"bucket {i}", channel, channel + c))
            channel += c
        t = max(t, channel)
        step_rows.append(("optimizer", "optimizer", t, t + t_opt))
        t += t_opt
        for rank in range(s.dp):
            rows.append(_row(rank, step, "step", f"step {step}", start, t, step < warmup))
            rows += [_row(rank, step, k, n, a, b, step < warmup) for k, n, a, b in step_rows]
    return to_frame(rows)


def replay_pipeline(
    schedule,
    t_forward: float,
    t_backward: float,
    t_p2p: float = 0.0,
    steps: int = 1,
    warmup: int = 0,
    num_chunks: int | None = None,
):
    """Step a pipeline schedule (one action list per rank) with fixed per-chunk durations.

    ``t_forward`` / ``t_backward``: seconds of one micro-batch through one model chunk (a number, or one per
    stage); ``t_p2p``: one
    activation (or gradient) message. Raises ValueError if the schedule deadlocks.
    """
    p = len(schedule)
    if num_chunks is None:
        num_chunks = 1 + max((a.chunk for actions in schedule for a in actions), default=0)
    rows, t0 = [], 0.0
    for step in range(steps):
        clock = [t0] * p
        nxt = [0] * p
        arrivals: dict = {}  # (direction, microbatch, receiving stage) -> time the message is there
        while any(nxt[r] < len(schedule[r]) for r in range(p)):
            progressed = False
            for r in range(p):
                while nxt[r] < len(schedule[r]):
                    a = schedule[r][nxt[r]]
                    stage = a.chunk * p + r
                    if a.op in ("recv_forward", "recv_backward"):
                        key = ("f" if a.op == "recv_forward" else "b", a.microbatch, stage)
                        if key not in arrivals:
                            break  # wait for the sender
                        ready = arrivals.pop(key)
                        if ready > clock[r]:
                            rows.append(_row(r, step, "wait", f"{a.op} {a.microbatch}", clock[r], ready, step < warmup))
                            clock[r] = ready
                    elif a.op in ("send_forward", "send_backward"):
                        forward = a.op == "send_forward"
                        arrivals[("f" if forward else "b", a.microbatch, stage + (1 if forward else -1))] = (
                            clock[r] + t_p2p
                        )
                        if t_p2p:
                            rows.append(
                                _row(
                                    r, step, "comm", f"{a.op} {a.microbatch}", clock[r], clock[r] + t_p2p, step < warmup
                                )
                            )
                    else:
                        d = t_forward if a.op == "forward" else t_backward
                        if not isinstance(d, (int, float)):
                            d = d[stage]  # per-stage durations
                        label = "F" if a.op == "forward" else "B"
                        name = f"{label}{a.microbatch}" + (f" c{a.chunk}" if num_chunks > 1 else "")
                        rows.append(_row(r, step, a.op, name, clock[r], clock[r] + d, step < warmup))
                        clock[r] += d
                    nxt[r] += 1
                    progressed = True
            if not progressed:
                stuck = {r: schedule[r][nxt[r]] for r in range(p) if nxt[r] < len(schedule[r])}
                raise ValueError(f"the schedule deadlocks: ranks wait on {stuck}")
        end = max(clock)
        rows += [_row(r, step, "step", f"step {step}", t0, end, step < warmup) for r in range(p)]
        t0 = end
    return to_frame(rows)


def replay_pipeline_model(schedule, model, hardware, strategy, steps: int = 1):
    """A pipeline schedule replayed with the cost model's stage times for ``model`` split by ``strategy``."""

    s = strategy.validate(model=model, hardware=hardware)
    t_f, t_b = stage_times(model, hardware, s, min(s.world_size, hardware.devices_per_node))
    v = s.virtual_stages
    act = s.micro_batch * model.seq_len * model.hidden * (2 if s.mixed_precision else 4)
    # the message crosses NVLink or InfiniBand depending on where the stages sit on the rank grid
    return replay_pipeline(schedule, t_f / v, t_b / v, p2p_time(act, s, hardware), steps=steps)
