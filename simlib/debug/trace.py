"""Standard traces: torch.profiler on every rank, merged into one Chrome/Perfetto trace.

    with trace.profile("results/trace") as prof:       # on every rank (a collective at exit)
        record = train(task, plan, steps=8)
    prof.path                                          # results/trace/trace.json on rank 0: open it in
                                                       # https://ui.perfetto.dev or chrome://tracing
    trace.exposed_comm(prof.path)                      # {"per_rank": {...}, "exposed_comm_time": s}

The merged file has one process row per rank ("rank 0", "rank 1", ...). In each: the main thread's operators
(the compute), one **communication** track per thread that moved data (Gloo runs a collective on its own
threads; ``gloo:all_reduce`` is the time the data was in flight, including the wait for the slowest peer), and
the course's own spans (:class:`simlib.timeline.Timeline`: step, forward, backward, comm, optimizer, wait) as
annotation tracks, placed on the profiler's clock.

The file keeps the trace format's rules, so every viewer draws it as recorded: a thread's complete (``"X"``)
events are drawn as a stack, so the slices of one track nest (a bucket's all-reduce, running on Gloo's thread, and
the main thread's wait for it overlap without nesting: they are on tracks of their own, and a family of spans that
overlaps itself, such as several buckets in flight, gets as many tracks as it needs, see :func:`lanes`); metadata
(``"M"``) events name every process and track and carry a ``ts``.

:func:`exposed_comm` computes, from the trace alone, the communication no compute overlaps: per rank and step,
the union of the communication tracks' slices and of the main thread's collective calls (``c10d::allreduce_``:
handing a collective over, or blocking in it) minus the time the main thread was running operators (the
innermost ones: an autograd function whose forward waits for an all-gather is not compute while it waits). It is the
figure the run record reports as ``exposed_comm_time`` (there from the course's spans), now derived from
torch's own record of the run: the two are compared in ``tests/test_trace.py`` and the lesson. Both count the
same things: the measured steps only (warm-up and the logged loss's all-reduce, which runs after the step, left
out), every collective inside a step (the gradient buckets, the non-finite check, a clipping norm's all-reduce),
and a collective called inside a compute span as exposed (the record cuts it out of the span).

Limits: one node (every rank's profiler uses the same clock); CUDA kernels appear when CUDA is used, but the
exposed figure here reads CPU threads only.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import time
from pathlib import Path

from ..env import quiet_profiler  # noqa: F401 - where lessons and tests found it
from ..timeline import overlap, union

COMM_PREFIXES = ("gloo:", "nccl:", "ncclDevKernel", "ncclKernel")  # slices that are data in flight
ISSUE_PREFIXES = ("c10d::", "record_param_comms")  # the main thread in a collective call: communication, not compute
COMPUTE_TID, STEPS_TID, SPANS_TID, COMM_SPANS_TID, WAIT_SPANS_TID = 0, 1, 2, 3, 4
COMM_TID0, MAIN_COMM_TID = 10, 9
LANES = 1000  # track t's further tracks (when its spans overlap without nesting) are LANES * t + 1, + 2, ...
SPAN_FAMILIES = {  # the course's spans, by kind, onto tracks: (track, its name)
    "step": (STEPS_TID, "simlib steps"),
    "comm": (COMM_SPANS_TID, "simlib comm spans"),
    "wait": (WAIT_SPANS_TID, "simlib waits"),
}
OTHER_SPANS = (SPANS_TID, "simlib spans")  # forward, backward, optimizer, other


class profile:
    """Profile this rank with ``torch.profiler`` while the block runs; at exit every rank writes
    ``out_dir/rank{r}.json`` and rank 0 merges them into ``out_dir/trace.json`` (``self.path``).

    The exit is collective (a barrier before the merge): every rank must use the block.
    """

    def __init__(self, out_dir, record_shapes: bool = False, with_stack: bool = False):
        self.out_dir = Path(out_dir)
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self.spans: list[dict] = []
        self.path = None

    def __enter__(self) -> profile:
        quiet_profiler()
        import torch
        import torch.distributed as dist
        from torch.profiler import ProfilerActivity, record_function

        from ..timeline import Timeline

        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.out_dir.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = torch.profiler.profile(
            activities=activities, record_shapes=self.record_shapes, with_stack=self.with_stack
        )
        self.prof.__enter__()
        self.clock = _clock_marks(record_function)
        spans, original = self.spans, Timeline.add
        self._original_add = original

        def add(tl, kind, start, end, name=None, step=None):
            original(tl, kind, start, end, name=name, step=step)
            if isinstance(start, float):  # CPU spans (CUDA events are resolved later and not placed here)
                row = tl._rows[-1]
                spans.append(
                    {
                        "kind": kind,
                        "name": row["name"],
                        "step": row["step"],
                        "warmup": row["warmup"],
                        "start": start,
                        "end": end,
                    }
                )

        Timeline.add = add
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        from ..timeline import Timeline

        Timeline.add = self._original_add
        from torch.profiler import record_function

        self.clock += _clock_marks(record_function)
        self.prof.__exit__(*exc)
        own = self.out_dir / f"rank{self.rank}.json"
        self.prof.export_chrome_trace(str(own))
        data = json.loads(own.read_text())
        data["simlibSpans"] = {"clock": self.clock, "spans": self.spans}
        own.write_text(json.dumps(data))
        if exc[0] is not None:
            return
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()
        if self.rank == 0:
            self.path = self.out_dir / "trace.json"
            merged = merge([self.out_dir / f"rank{r}.json" for r in range(self.world_size)])
            self.path.write_text(json.dumps(merged))


def _clock_marks(record_function, n: int = 5) -> list[float]:
    """perf_counter readings taken inside ``simlib.clock`` slices: each slice starts (profiler clock) just before
    its reading, so the largest (slice start - reading) over several marks is the closest estimate of the offset
    between the two clocks (a rank preempted between the two only makes that mark's estimate smaller)."""
    marks = []
    for _ in range(n):
        with record_function("simlib.clock"):
            marks.append(time.perf_counter())
    return marks


def _load(path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _base_us(data: dict) -> float:
    return data.get("baseTimeNanoseconds", 0) / 1e3


def merge(paths) -> dict:
    """One Chrome trace from per-rank profiler traces (files written by :class:`profile`): process ``r`` is rank
    ``r``; its main thread is "compute (main thread)", every other thread with data in flight becomes a
    "communication" track, and the course's spans become the "simlib steps" / "simlib spans" / "simlib comm spans"
    / "simlib waits" tracks (and "... (2)", ... where a family's spans overlap without nesting: :func:`lanes`).
    Times are on one clock, from the earliest event."""
    per_rank = [_load(p) for p in paths]
    events, t0 = [], None
    for data in per_rank:
        for e in data["traceEvents"]:
            if e.get("ph") == "X":
                ts = e["ts"] + _base_us(data)
                t0 = ts if t0 is None else min(t0, ts)
    for data in per_rank:
        rank = (data.get("distributedInfo") or {}).get("rank", per_rank.index(data))
        base = _base_us(data) - t0
        xs = [e for e in data["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("tid"), int)]
        main = _main_tid(xs)
        comm_threads = sorted({e["tid"] for e in xs if e["tid"] != main and e["name"].startswith(COMM_PREFIXES)})
        tids = {main: COMPUTE_TID, **{t: COMM_TID0 + i for i, t in enumerate(comm_threads)}}
        names = {
            COMPUTE_TID: "compute (main thread)",
            STEPS_TID: "simlib steps",
            SPANS_TID: "simlib spans",
            COMM_SPANS_TID: "simlib comm spans",
            WAIT_SPANS_TID: "simlib waits",
        }
        names.update({COMM_TID0 + i: f"communication (thread {t})" for i, t in enumerate(comm_threads)})
        clock_ts = sorted(e["ts"] for e in xs if e["name"] == "simlib.clock")
        for e in xs:
            if e["tid"] not in tids or e["name"] == "simlib.clock":
                continue  # threads with neither compute nor communication (idle helpers)
            out = {k: e[k] for k in ("ph", "name", "cat", "dur") if k in e}
            out.update(pid=rank, tid=tids[e["tid"]], ts=e["ts"] + base, args=e.get("args", {}))
            if e["tid"] == main and e["name"].startswith(COMM_PREFIXES):
                out.update(cat="communication", tid=MAIN_COMM_TID)  # a blocking send/recv runs on the main thread
                names[MAIN_COMM_TID] = "communication (main thread, blocking)"
            elif tids[e["tid"]] >= COMM_TID0 and e["name"].startswith(COMM_PREFIXES):
                out["cat"] = "communication"  # the operators Gloo runs inside it (copies) keep their own category
            events.append(out)
        simlib = data.get("simlibSpans")
        if simlib and len(clock_ts) == len(simlib["clock"]):  # perf_counter seconds -> merged trace microseconds
            offset = max(ts - c * 1e6 for ts, c in zip(clock_ts, simlib["clock"])) + base
            spans = [dict(s, ts=s["start"] * 1e6 + offset, dur=(s["end"] - s["start"]) * 1e6) for s in simlib["spans"]]
            for family in [*SPAN_FAMILIES, None]:
                track, name = SPAN_FAMILIES.get(family, OTHER_SPANS)
                mine = [s for s in spans if (s["kind"] if s["kind"] in SPAN_FAMILIES else None) == family]
                lane = lanes([(s["ts"], s["ts"] + s["dur"]) for s in mine])
                for k in range(1, max(lane, default=0) + 1):
                    names[LANES * track + k] = f"{name} ({k + 1})"
                for s, k in zip(mine, lane):
                    events.append(
                        {
                            "ph": "X",
                            "cat": "simlib",
                            "name": s["name"],
                            "pid": rank,
                            "tid": LANES * track + k if k else track,
                            "ts": s["ts"],
                            "dur": s["dur"],
                            "args": {"kind": s["kind"], "step": s["step"], "warmup": s["warmup"]},
                        }
                    )
        events += _metadata(rank, names)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "simlib.debug.trace.merge", "ranks": len(per_rank)},
    }


def lanes(intervals) -> list[int]:
    """For each ``(start, end)``, the track (0, 1, ...) to draw it on so that the intervals on every track nest
    (a viewer stacks one thread's slices; two that overlap without nesting would be drawn as a staircase of
    frames that never close). Greedy, in order of start (the longer first): the first track whose innermost
    open interval is gone or contains it."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    stacks: list[list] = []  # per track: the ends of the intervals still open, innermost last
    out = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for k, stack in enumerate(stacks + [[]]):  # noqa: B007 - k is the lane found, read after the loop
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                break
        if k == len(stacks):
            stacks.append(stack)
        stacks[k].append(end)
        out[i] = k
    return out


def _metadata(rank: int, names: dict) -> list:
    """The process row "rank r" and its tracks' names, sorted by track with each track's further lanes after it
    (metadata events carry a ``ts`` too: the format lists it among every event's fields)."""
    events = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "ts": 0, "args": {"sort_index": rank}},
    ]
    for index, tid in enumerate(sorted(names, key=lambda t: divmod(t, LANES) if t >= LANES else (t, 0))):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "ts": 0, "args": {"name": names[tid]}}
        )
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "ts": 0, "args": {"sort_index": index}}
        )
    return events


def _main_tid(events) -> int | None:
    """The thread that ran the operators (autograd and the optimizer run on the calling thread on CPU)."""
    busy: dict = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            busy[e["tid"]] = busy.get(e["tid"], 0.0) + e.get("dur", 0.0)
    return max(busy, key=busy.get) if busy else None


def _leaves(events) -> list:
    """Intervals of the operators that contain no other operator: the kernels that compute. (An enclosing slice,
    such as an autograd function whose forward waits for an all-gather, would hide the wait as "compute".)"""
    spans = sorted(((e["ts"], e["ts"] + e["dur"]) for e in events), key=lambda s: (s[0], -s[1]))
    return [(a, b) for k, (a, b) in enumerate(spans) if k + 1 == len(spans) or spans[k + 1][0] >= b]


def _clip(intervals, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _blocked(calls, main_ops, slices) -> list:
    """[call, resume] for each collective call the main thread blocked in: after the ``c10d::`` call it ran no
    operator until the first communication slice begun after the call had ended (a synchronous all-reduce). It was
    in the call until its next operator, as the run record's span around the call counts it (on a loaded machine
    that includes the wait to be scheduled again). An asynchronous call (a bucket in backward) is followed by
    operators at once: only its own slice counts."""
    starts = sorted(e["ts"] for e in main_ops)
    firsts = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices)
    out = []
    for c in calls:
        end = c["ts"] + c["dur"]
        k = bisect.bisect_left(starts, end)
        resume = starts[k] if k < len(starts) else None
        j = bisect.bisect_left(firsts, (c["ts"], float("-inf")))
        if resume is not None and j < len(firsts) and firsts[j][1] <= resume:
            out.append((c["ts"], resume))
    return out


def exposed_comm(trace) -> dict:
    """Exposed communication from a merged trace (a path or the dict :func:`merge` returns).

    Per rank and measured step (the simlib step slices; warm-up steps left out): seconds of communication
    (union of the communication slices, and of the main thread's calls into a collective: ``c10d::...``, where
    it hands the collective over, to its next operator when it blocked in it) during which the main thread ran
    no operator. Returns ``per_rank``
    ({rank: {step: seconds}}), ``median_per_rank`` and ``exposed_comm_time`` (the mean over ranks of the
    median over steps: how the run record aggregates its own figure), plus the same for ``comm_time``.
    """
    data = trace if isinstance(trace, dict) else _load(trace)
    by_rank: dict = {}
    for e in data["traceEvents"]:
        if e.get("ph") == "X":
            by_rank.setdefault(e["pid"], []).append(e)
    per_rank, comm_per_rank = {}, {}
    for rank, evs in sorted(by_rank.items()):
        steps = [e for e in evs if e["tid"] == STEPS_TID and not e["args"].get("warmup")]
        slices = [e for e in evs if e.get("cat") == "communication"]
        calls = [e for e in evs if e["tid"] == COMPUTE_TID and e["name"].startswith(ISSUE_PREFIXES)]
        comm = union(
            [(e["ts"], e["ts"] + e["dur"]) for e in slices + calls]
            + _blocked(calls, [e for e in evs if e["tid"] == COMPUTE_TID and e.get("cat") == "cpu_op"], slices)
        )
        compute = union(
            _leaves(
                [
                    e
                    for e in evs
                    if e["tid"] == COMPUTE_TID
                    and e.get("cat") == "cpu_op"
                    and not e["name"].startswith(ISSUE_PREFIXES + COMM_PREFIXES)
                ]
            )
        )
        per_rank[rank], comm_per_rank[rank] = {}, {}
        for s in steps:
            lo, hi = s["ts"], s["ts"] + s["dur"]
            c = _clip(comm, lo, hi)
            total = sum(b - a for a, b in c)
            per_rank[rank][s["args"]["step"]] = (total - overlap(c, _clip(compute, lo, hi))) / 1e6
            comm_per_rank[rank][s["args"]["step"]] = total / 1e6
    medians = {r: statistics.median(v.values()) for r, v in per_rank.items() if v}
    comm_medians = {r: statistics.median(v.values()) for r, v in comm_per_rank.items() if v}
    return {
        "per_rank": per_rank,
        "median_per_rank": medians,
        "exposed_comm_time": statistics.fmean(medians.values()) if medians else None,
        "comm_time": statistics.fmean(comm_medians.values()) if comm_medians else None,
    }


def check(path) -> dict:
    """Structure of a merged trace, for tests: process rows (ranks) and which of them have a communication track.
    Raises ``ValueError`` when the file is not a Chrome trace (no ``traceEvents`` list of dicts with ``ph``)."""
    data = _load(path)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) and "ph" in e for e in events):
        raise ValueError(f"{path} is not a Chrome trace: no traceEvents list of events")
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    comm_slices = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "communication":  # data in flight (gloo:..., nccl...), not the copies
            comm_slices[e["pid"]] = comm_slices.get(e["pid"], 0) + 1
    return {
        "processes": processes,
        "threads": threads,
        "comm_slices": comm_slices,
        "events": sum(e["ph"] == "X" for e in events),
    }


def main(argv=None) -> int:
    """``python -m simlib.debug.trace DIR``: merge ``DIR/rank*.json`` (written by :class:`profile`) into
    ``DIR/trace.json`` and print the exposed communication per step."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(main.__doc__)
        return 2
    d = Path(argv[0])
    files = sorted(d.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    (d / "trace.json").write_text(json.dumps(merge(files)))
    print(d / "trace.json", "exposed communication per step (s):", exposed_comm(d / "trace.json")["exposed_comm_time"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
