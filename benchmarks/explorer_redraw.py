"""How long lesson 13's planner explorer takes to redraw when a learner moves one control.

The explorer is built as the lesson builds it (``widgets.planner_explorer``; its first draw, at the default
settings, is the warm-up: imports and first caches), then five controls are moved one after another, each to a
setting not seen before (nodes, global batch, sequence, memory limit, model), and each redraw's time is read from
the widget itself (``box.redraw.seconds``: the search and the figure, what the learner waits for). The median and
the range of the five are reported with the process's CPU seconds and the load average, since the box is shared.

    python benchmarks/explorer_redraw.py [--space quick|full] [--out benchmarks/results/explorer_redraw.json]

``--space quick`` is the search lesson 13 runs in quick mode (the suite's), ``full`` the whole space (a learner's
run). Between moves the learner reads the figure (``--think``, default: until the background searches of the next
moves are done, at most 120 s); ``--no-prefetch`` turns those off, so that every redraw searches (with the pricer
kept from the searches before). Writes benchmarks/results/explorer_redraw_<space>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")

import report  # noqa: E402  benchmarks/report.py: machine info and the JSON file

# lesson 13's GPU_SPACE in quick mode (notebooks/13_design_a_run.ipynb)
QUICK_SPACE = dict(recompute=("none", "full"), tp_overlap=(False,), max_micro_batch=2, max_virtual_stages=4)
MOVES = [("nodes", 8), ("global_batch", 512), ("seq_len", 4096), ("memory_gb", 60), ("model", "8B")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=("quick", "full"), default="quick")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-prefetch", action="store_true", help="no background search of the next moves (each redraw searches)"
    )
    parser.add_argument(
        "--think",
        type=float,
        default=120.0,
        help="seconds the learner reads each figure: the background searches get at most this long (default 120)",
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()
    from simlib import widgets

    space = QUICK_SPACE if args.space == "quick" else None
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        box = widgets.planner_explorer(space=space, prefetch=not args.no_prefetch)  # the first draw: the warm-up
    except TypeError:  # a simlib from before the explorer searched ahead (to measure the "before")
        box = widgets.planner_explorer(space=space)
    first = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    controls = {c.description: c for c in box.children[0].children}
    names = {
        "nodes": "nodes",
        "global_batch": "global batch",
        "seq_len": "sequence",
        "memory_gb": "GB limit",
        "model": "model",
    }
    rows = []
    for name, value in MOVES:
        t0 = time.perf_counter()
        if hasattr(box, "searches"):
            box.searches.wait(args.think)  # the learner reads the figure
        thought = time.perf_counter() - t0
        c0 = time.thread_time()  # the redraw runs in this thread (the background searches in another)
        controls[names[name]].value = value
        rows.append(
            dict(
                move=f"{name} -> {value}",
                seconds=box.redraw.seconds,
                cpu=time.thread_time() - c0,
                read_s=thought,
                status=box.redraw.status.value[:90],
            )
        )
        print(
            f"{rows[-1]['move']:22s} {rows[-1]['seconds']:6.2f} s (cpu {rows[-1]['cpu']:.2f} s)  {rows[-1]['status']}"
        )
    secs = [r["seconds"] for r in rows]
    summary = dict(
        median_s=statistics.median(secs),
        min_s=min(secs),
        max_s=max(secs),
        median_cpu_s=statistics.median(r["cpu"] for r in rows),
        first_draw=first,
    )
    print(
        f"{args.space} space, prefetch {not args.no_prefetch}: redraw median {summary['median_s']:.2f} s (range {summary['min_s']:.2f}-"
        f"{summary['max_s']:.2f}, CPU median {summary['median_cpu_s']:.2f} s); first draw {first['wall']:.1f} s; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"explorer_redraw_{args.space}.json")
    result = dict(
        benchmark="explorer_redraw",
        machine=report.machine(load),
        space=args.space,
        prefetch=not args.no_prefetch,
        think_s=args.think,
        summary=summary,
    )
    report.write({**result, "redraws": rows}, out)


if __name__ == "__main__":
    main()
