"""Standard traces (simlib.debug.trace): torch.profiler on every rank, merged into one Chrome trace."""

import json
import os


def _profiled_gpt(out_dir):
    import torch.distributed as dist

    from simlib.debug import trace
    from simlib.projects.gpt import run as project_gpt
    from simlib.train import train

    cfg = {
        **project_gpt.settings(quick=True),
        "steps": 4,
        "eval_every": 0,
        "log_every": 10,
        "verbose": False,
        "measure_memory": False,
        "warmup": 1,
    }
    task = cfg.pop("task")
    with trace.profile(out_dir) as prof:
        record = train(task, project_gpt.plan_for("dp", dist.get_world_size()), **cfg)
    return str(prof.path) if prof.path else None, record.summary["exposed_comm_time"]


def test_merged_trace_has_a_row_per_rank_and_a_communication_track(cluster2, tmp_path):
    from simlib.debug import trace

    (path, record_exposed), (other, _) = cluster2.run(_profiled_gpt, str(tmp_path))
    assert other is None and path == str(tmp_path / "trace.json")  # rank 0 merges
    data = json.loads((tmp_path / "trace.json").read_text())  # valid JSON, Chrome's trace format
    assert format_problems(data) == []  # slices nest on every track, metadata names them and carries ts
    shape = trace.check(path)
    assert shape["processes"] == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        names = [name for (pid, _), name in shape["threads"].items() if pid == rank]
        assert "compute (main thread)" in names and "simlib steps" in names and "simlib spans" in names
        assert any(n.startswith("communication") for n in names), names
        assert shape["comm_slices"][rank] > 0
    ops = {e["name"] for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "communication"}
    assert "gloo:all_reduce" in ops and all(op.startswith("gloo:") for op in ops), ops  # data in flight only
    spans = {e["args"]["kind"] for e in data["traceEvents"] if e.get("cat") == "simlib"}
    assert {"step", "forward", "backward", "optimizer"} <= spans
    exposed = trace.exposed_comm(path)
    assert set(exposed["median_per_rank"]) == {0, 1} and len(exposed["per_rank"][0]) == 3  # 4 steps, 1 warm-up
    assert 0 < exposed["exposed_comm_time"] <= exposed["comm_time"] + 1e-9
    assert record_exposed is not None and record_exposed > 0


# ── the trace format (Chrome's trace event format, as Perfetto, chrome://tracing and speedscope read it) ──
NS = 1e-3  # µs: viewers read times to the nanosecond; a child ending within 1 ns of its parent still nests
NAMED_META = {
    "process_name": "name",
    "thread_name": "name",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
}


def format_problems(data) -> list:
    """What a trace viewer would draw wrongly or refuse, in a merged trace (an independent reading of the
    format, not the merger's own code): every event has its required fields; metadata events name every
    process and track and carry ``ts``; on each (pid, tid) the complete events nest (none partially overlaps
    another, which a viewer would draw as a staircase of frames that never close)."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        return ["no traceEvents list"]
    problems, tracks, named_pids, named_tracks = [], {}, set(), set()
    for i, e in enumerate(data["traceEvents"]):
        ph = e.get("ph")
        need = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "M": ("name", "ph", "ts", "pid", "tid", "args")}
        if ph not in need:
            problems.append(f"event {i}: phase {ph!r}: the merged trace holds complete (X) and metadata (M) events")
            continue
        missing = [k for k in need[ph] if k not in e]
        if missing:
            problems.append(f"event {i} ({ph} {e.get('name')!r}) lacks {missing}")
            continue
        if not all(isinstance(e[k], (int, float)) for k in ("ts", "dur") if k in e):
            problems.append(f"event {i} ({e['name']!r}): ts/dur not numbers")
        if ph == "X":
            if e["dur"] < 0:
                problems.append(f"event {i} ({e['name']!r}): negative duration {e['dur']}")
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e["name"] not in NAMED_META or NAMED_META[e["name"]] not in e["args"]:
            problems.append(f"metadata event {i}: {e['name']!r} with args {e['args']} names nothing")
        elif e["name"] == "process_name":
            named_pids.add(e["pid"])
        elif e["name"] == "thread_name":
            named_tracks.add((e["pid"], e["tid"]))
    for (pid, tid), xs in sorted(tracks.items(), key=str):
        if pid not in named_pids:
            problems.append(f"process {pid} has slices but no process_name")
        if (pid, tid) not in named_tracks:
            problems.append(f"track ({pid}, {tid}) has slices but no thread_name")
        open_ = []
        for e in sorted(xs, key=lambda e: (e["ts"], -e["dur"])):
            start, end = e["ts"], e["ts"] + e["dur"]
            while open_ and open_[-1][1] <= start + NS:
                open_.pop()
            if open_ and end > open_[-1][1] + NS:
                problems.append(
                    f"track ({pid}, {tid}): {e['name']!r} [{start:.3f}, {end:.3f}] overlaps "
                    f"{open_[-1][0]!r} (ends {open_[-1][1]:.3f}) without nesting"
                )
            open_.append((e["name"], end))
    return problems


def _rank_file(path, rank, spans):
    """A per-rank file as :class:`simlib.debug.trace.profile` writes it: torch.profiler's events (main thread 7,
    a Gloo thread 8 with a copy inside its all-reduce), five clock marks, and the course's spans (seconds on the
    profiler's clock, so the merge places them where they are given)."""
    marks = [100.0 + k for k in range(5)]
    events = [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "ts": 0, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1000.0, "dur": 400.0},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 7, "tid": 7, "ts": 1400.0, "dur": 5.0},
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": 7,
            "tid": 8,
            "ts": 1410.0,
            "dur": 300.0,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 7, "tid": 8, "ts": 1500.0, "dur": 10.0},
        *(
            {"ph": "X", "cat": "user_annotation", "name": "simlib.clock", "pid": 7, "tid": 7, "ts": m, "dur": 1.0}
            for m in marks
        ),
    ]
    data = {
        "distributedInfo": {"rank": rank},
        "baseTimeNanoseconds": 0,
        "traceEvents": events,
        "simlibSpans": {
            "clock": [m / 1e6 for m in marks],
            "spans": [dict(kind=k, name=n, step=1, warmup=False, start=a / 1e6, end=b / 1e6) for k, n, a, b in spans],
        },
    }
    path.write_text(json.dumps(data))
    return path


# the spans of one data-parallel step: buckets in flight overlap each other and the main thread's wait
DP_STEP = [
    ("step", "step 1", 990, 1800),
    ("forward", "forward", 1000, 1200),
    ("backward", "backward", 1200, 1405),
    ("comm", "bucket 0", 1380, 1700),
    ("comm", "bucket 1", 1400, 1720),
    ("wait", "wait for buckets", 1405, 1730),
    ("optimizer", "optimizer", 1730, 1790),
]


def test_merged_trace_keeps_the_format(tmp_path):
    from simlib.debug import trace

    merged = trace.merge([_rank_file(tmp_path / f"rank{r}.json", r, DP_STEP) for r in (0, 1)])
    assert format_problems(merged) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "thread_name"}
    where = {
        e["name"]: threads[(e["pid"], e["tid"])]
        for e in merged["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 0 and e.get("cat") == "simlib"
    }
    assert where["wait for buckets"] == "simlib waits"
    assert {where["bucket 0"], where["bucket 1"]} == {"simlib comm spans", "simlib comm spans (2)"}
    assert where["step 1"] == "simlib steps" and where["forward"] == where["optimizer"] == "simlib spans"
    (tmp_path / "trace.json").write_text(json.dumps(merged))
    assert trace.check(tmp_path / "trace.json")["comm_slices"] == {0: 1, 1: 1}  # gloo:all_reduce, not its copy


def test_the_format_check_catches_a_staircase_and_unnamed_metadata(tmp_path):
    from simlib.debug import trace

    merged = trace.merge([_rank_file(tmp_path / "rank0.json", 0, DP_STEP)])
    onto_one = [
        dict(e, tid=3) if e.get("cat") == "simlib" and e["args"]["kind"] in ("comm", "wait") else e
        for e in merged["traceEvents"]
    ]
    problems = format_problems({"traceEvents": onto_one})
    assert any("'bucket 1'" in p and "without nesting" in p for p in problems), problems
    no_ts = [{k: v for k, v in e.items() if not (e["ph"] == "M" and k == "ts")} for e in merged["traceEvents"]]
    assert any("lacks ['ts']" in p for p in format_problems({"traceEvents": no_ts}))


def test_lanes_nest_every_track():
    from simlib.debug.trace import lanes

    spans = [(0, 10), (1, 5), (4, 12), (6, 8), (11, 13), (2, 3)]
    lane = lanes(spans)
    assert lane == [0, 0, 1, 0, 0, 0]  # (4, 12) straddles (0, 10)'s end: its own track; (6, 8) nests in (0, 10)
    meta = [
        {"ph": "M", "name": n, "pid": 0, "tid": k, "ts": 0, "args": {"name": "x"}}
        for k in (0, 1)
        for n in ("process_name", "thread_name")
    ]
    xs = [{"ph": "X", "name": str(s), "pid": 0, "tid": k, "ts": s[0], "dur": s[1] - s[0]} for s, k in zip(spans, lane)]
    assert format_problems({"traceEvents": meta + xs}) == []
    assert format_problems({"traceEvents": meta + [dict(e, tid=0) for e in xs]}) != []


def test_profiling_prints_nothing_on_stderr(tmp_path):
    """Kineto's 'USDT: ... profiler_start' lines went to stderr (red in a notebook, once per rank and start)."""
    import subprocess
    import sys

    code = (
        "import torch\nfrom simlib.debug import trace\n"
        f"with trace.profile({str(tmp_path)!r}) as prof:\n    torch.ones(64, 64).sum()\nprint(prof.path)"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "trace.json"), done.stderr
    assert done.stderr == "", done.stderr
