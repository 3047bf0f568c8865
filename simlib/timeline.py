"""Per-rank spans (forward, backward, comm, optimizer, wait) on one clock, gathered into one table.

    tl = Timeline(warmup=2)
    for step in range(steps):
        with tl.step(step):
            with tl.span("forward"):  loss = model(x).sum()
            with tl.span("backward"): loss.backward()
            with tl.span("comm"):     all_reduce_grads(model)
            with tl.span("optimizer"): opt.step()
    table = tl.gather()          # every rank calls it; each gets the whole table (a pandas DataFrame)

Times come from ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, one clock for every process of a node);
on CUDA devices spans are timed with CUDA events and placed on the same host clock, so GPU work is timed
when it runs, not when it was queued. Every table has the columns of :data:`COLUMNS`; the simulator's
replay produces tables of the same shape, so one plot shows predicted beside measured.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np

KINDS = ("step", "forward", "backward", "comm", "optimizer", "wait", "other")
COMPUTE_KINDS = ("forward", "backward", "optimizer")  # what hides communication (see :func:`exposed_time`)
COLUMNS = ["rank", "step", "kind", "name", "start", "end", "duration", "warmup"]


class Timeline:
    """Records spans of one rank. ``warmup``: the first steps, marked and left out of summaries."""

    def __init__(self, rank: int | None = None, warmup: int = 0, device=None):
        import torch
        import torch.distributed as dist

        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank
        self.warmup = warmup
        self.device = torch.device(device) if device is not None else None
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.current_step = None
        self._rows: list[dict] = []
        self._pending: list[tuple] = []  # CUDA events not yet resolved
        self._cuda_ref = None
        self._open: dict = {}  # thread id -> holes of the compute spans open on it, innermost last

    # ── clock ──
    def _now(self):
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            if self._cuda_ref is None:
                torch.cuda.synchronize(self.device)
                self._cuda_ref = (event, time.perf_counter())
            return event
        return time.perf_counter()

    def _resolve(self) -> None:
        if not self._pending:
            return
        import torch

        torch.cuda.synchronize(self.device)
        ref_event, ref_host = self._cuda_ref
        for row, start, end in self._pending:
            row["start"] = ref_host + ref_event.elapsed_time(start) / 1e3
            row["end"] = ref_host + ref_event.elapsed_time(end) / 1e3
            row["duration"] = row["end"] - row["start"]
        self._pending.clear()

    # ── recording ──
    @contextmanager
    def span(self, kind: str, name: str | None = None, step: int | None = None):
        """Time the enclosed block as one span of ``kind`` (one of :data:`KINDS`).

        A "comm" or "wait" span opened inside a compute span (forward, backward, optimizer) on the same thread is
        a blocking collective: the thread computed nothing meanwhile, so it is cut out of the compute span (which
        is recorded as the pieces around it) and counts as exposed, as a profiler trace shows it.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown span kind {kind!r}: use one of {KINDS}")
        step = self.current_step if step is None else step
        stack = self._open.setdefault(threading.get_ident(), [])  # [holes, ...] of the open compute spans
        holes: list = []
        blocking = kind in ("comm", "wait") and not any(h and h[-1] is None for h in stack)  # outermost only
        if kind in COMPUTE_KINDS:
            stack.append(holes)
        elif blocking:
            for outer in stack:
                outer.append(None)  # open hole: a comm span nested in this one does not cut again
        start = self._now()
        try:
            yield
        finally:
            end = self._now()
            if kind in COMPUTE_KINDS:
                stack.pop()
            elif blocking:
                for outer in stack:
                    outer[-1] = (start, end)
            edges = [start] + [t for hole in holes for t in hole] + [end]
            for a, b in zip(edges[::2], edges[1::2]):
                self.add(kind, a, b, name=name, step=step)

    def add(self, kind: str, start, end, name: str | None = None, step: int | None = None) -> None:
        """Add a span measured elsewhere (times from ``time.perf_counter`` or CUDA events)."""
        step = self.current_step if step is None else step
        row = dict(
            rank=self.rank,
            step=-1 if step is None else step,
            kind=kind,
            name=name or kind,
            start=start,
            end=end,
            duration=None,
            warmup=step is not None and step < self.warmup,
        )
        if self.cuda and not isinstance(start, float):
            self._pending.append((row, start, end))
        else:
            row["duration"] = end - start
        self._rows.append(row)

    @contextmanager
    def step(self, step: int):
        """Mark the enclosed block as training step ``step``; spans inside belong to it."""
        self.current_step = step
        try:
            with self.span("step", name=f"step {step}", step=step):
                yield
        finally:
            self.current_step = None

    def records(self) -> list[dict]:
        self._resolve()
        return [dict(r) for r in self._rows]

    def frame(self):
        """This rank's spans as a DataFrame (absolute clock)."""
        return to_frame(self.records())

    def gather(self, relative: bool = True, group=None):
        """All ranks' spans in one DataFrame, on every rank of ``group`` (default: the world).

        A collective: every rank of the group must call it.
        """
        import torch.distributed as dist

        rows = self.records()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            everyone = [None] * dist.get_world_size(group)
            dist.all_gather_object(everyone, rows, group=group)
            rows = [r for part in everyone for r in part]
        return to_frame(rows, relative=relative)


def to_frame(rows, relative: bool = True):
    """Rows (dicts with :data:`COLUMNS`) -> DataFrame sorted by rank and start; times from the first span."""
    import pandas as pd

    df = pd.DataFrame(list(rows), columns=COLUMNS)
    if len(df) and relative:
        t0 = df["start"].min()
        df["start"] -= t0
        df["end"] -= t0
    return df.sort_values(["rank", "start"], kind="stable").reset_index(drop=True)


def step_times(df, include_warmup: bool = False):
    """Per-step wall time: from the first rank starting the step to the last rank ending it."""
    steps = df[df["kind"] == "step"]
    if not include_warmup:
        steps = steps[~steps["warmup"].astype(bool)]
    grouped = steps.groupby("step")
    return (grouped["end"].max() - grouped["start"].min()).rename("step_time")


def summarize(df) -> dict:
    """Median and spread of step time, and the time per kind per step (medians over ranks and steps).

    Returns ``step_time`` (median, s), ``step_time_iqr`` (s), ``step_time_min``, ``step_time_max``,
    ``steps`` (how many were kept), and ``<kind>_time`` for forward/backward/comm/optimizer/wait, plus
    ``comm_fraction`` = comm time / step time, and ``exposed_comm_time`` / ``exposed_comm_fraction``:
    the communication that no compute span (forward, backward, optimizer) overlaps, which is what the step
    waits for. Without overlap the two agree; with async all-reduces during backward, comm spans can add up
    to more than the step waits.
    """
    import pandas as pd

    times = step_times(df).to_numpy()
    if len(times) == 0:
        raise ValueError("no measured steps: record steps with Timeline.step() and run more than `warmup` of them")
    q1, q3 = np.percentile(times, [25, 75])
    out = dict(
        step_time=float(np.median(times)),
        step_time_iqr=float(q3 - q1),
        step_time_min=float(times.min()),
        step_time_max=float(times.max()),
        steps=int(len(times)),
    )
    body = df[(df["kind"] != "step") & (~df["warmup"].astype(bool))]
    per = body.groupby(["kind", "rank", "step"])["duration"].sum().groupby(["kind", "rank"]).median()
    for kind in KINDS[1:]:
        out[f"{kind}_time"] = float(per.loc[kind].mean()) if kind in per.index.get_level_values(0) else 0.0
    out["comm_fraction"] = out["comm_time"] / out["step_time"] if out["step_time"] > 0 else 0.0
    groups = list(body.groupby(["rank", "step"]))
    per_rank = pd.Series([exposed_time(g) for _, g in groups], index=[rank for (rank, _), _ in groups], dtype=float)
    out["exposed_comm_time"] = float(per_rank.groupby(level=0).median().mean()) if len(per_rank) else 0.0
    out["exposed_comm_fraction"] = out["exposed_comm_time"] / out["step_time"] if out["step_time"] > 0 else 0.0
    return out


def union(intervals) -> list:
    """Sorted, disjoint ``[start, end]`` intervals covering the same time as ``intervals`` (pairs, any order).
    The one interval union of the course: the run record's exposed time here and the trace's
    (:func:`simlib.debug.trace.exposed_comm`) both use it."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def overlap(xs, ys) -> float:
    """Time that interval lists ``xs`` and ``ys`` share, each already a :func:`union` (disjoint within itself)."""
    total = 0.0
    for a, b in xs:
        for c, d in ys:
            if d > a and c < b:
                total += min(b, d) - max(a, c)
    return total


def exposed_time(spans, hidden_by=("forward", "backward", "optimizer"), kind="comm") -> float:
    """Seconds of ``kind`` spans (of one rank and step) that no ``hidden_by`` span overlaps."""

    def intervals(mask):
        return union(zip(spans.loc[mask, "start"], spans.loc[mask, "end"]))

    comm = intervals(spans["kind"] == kind)
    return sum(b - a for a, b in comm) - overlap(comm, intervals(spans["kind"].isin(hidden_by)))
