"""What a timing can support: the sentence a lesson prints about its own measurement, and the quiet reference beside it.

On a shared machine a timing moves by tens of percent from run to run. A lesson that reads its timings must not let
that noise flip its conclusion, so every comparison a lesson draws from a time goes through :func:`compare`:

- on a **busy** machine (a load average above twice the cores this process may use: more than the lesson's own
  processes explain) it draws no conclusion at all;
- on a quiet one it says "faster" or "slower" only when the difference is larger than the run's own spread (the
  larger interquartile range of the two) and than :data:`FLOOR` of the time; otherwise "within the noise";
- a ratio of times is always printed as a **speedup** (reference time / time: above 1 is faster), never as a bare
  ratio that could read either way.

:func:`reference` reads the quiet run a benchmark committed (``benchmarks/results/<name>.json``, with its machine
and load), so the learner's own figure always has one to stand beside (:func:`machine_line`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
FLOOR = 0.05  # below 5 % a difference is within what a rerun moves on a quiet machine (lesson 01: 20-50 % loaded)

__all__ = ["speedup", "load", "busy", "load_line", "compare", "judge", "reference", "machine_line", "FLOOR"]


def speedup(reference_s: float, time_s: float) -> float:
    """How many times faster ``time_s`` is than ``reference_s``: reference / time (above 1: faster)."""
    if reference_s <= 0 or time_s <= 0:
        raise ValueError(f"times must be positive to make a speedup, got {reference_s!r} and {time_s!r}")
    return reference_s / time_s


def load() -> float | None:
    """The one-minute load average, or None where the system has none (Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


BUSY_PER_CORE = 2.0  # the lesson's own kernel and workers keep about one job per core runnable: more is others'


def busy(load_average: float | None = None, cores: int | None = None) -> bool:
    """True when the load average is above :data:`BUSY_PER_CORE` jobs per core. A lesson's own processes (the
    kernel and a worker per core) account for about one per core, so a load above twice the cores means other
    programs held the CPU for a large share of the run: its timings then say little about the code."""
    from ..env import cpu_count

    load_average = load() if load_average is None else load_average
    return load_average is not None and load_average > BUSY_PER_CORE * (cores or cpu_count())


def load_line(load_average: float | None = None, cores: int | None = None) -> str:
    """'load average 12.6 on 2 cores (busy: ...)' for the sentence under a timing."""
    from ..env import cpu_count

    load_average, cores = (load() if load_average is None else load_average), cores or cpu_count()
    if load_average is None:
        return f"load average unknown on {cores} cores"
    state = "busy: timings here are not evidence" if busy(load_average, cores) else "quiet enough to compare"
    return f"load average {load_average:.1f} on {cores} cores ({state})"


def compare(
    name: str,
    time_s: float,
    spread_s: float,
    reference_name: str,
    reference_s: float,
    reference_spread_s: float,
    load_average: float | None = None,
    cores: int | None = None,
) -> tuple[str, str]:
    """``(verdict, sentence)``: is ``name`` faster than ``reference_name`` in this run, and can the run tell?

    ``verdict`` is "faster", "slower", "within the noise" or "no conclusion (busy machine)". The sentence always
    gives the speedup (reference / time), both spreads and the load the run saw."""
    sp = speedup(reference_s, time_s)
    floor = FLOOR * max(time_s, reference_s)
    verdict = judge(time_s, spread_s, reference_s, reference_spread_s, floor, "slower", "faster", load_average, cores)
    sentence = (
        f"{name}: {time_s * 1e3:.1f} ms (spread {spread_s * 1e3:.1f}) against {reference_name}: "
        f"{reference_s * 1e3:.1f} ms (spread {reference_spread_s * 1e3:.1f}); speedup {sp:.2f}x -> {verdict}; "
        f"{load_line(load_average, cores)}"
    )
    return verdict, sentence


def judge(
    value: float,
    spread: float,
    reference_value: float,
    reference_spread: float,
    floor: float,
    higher: str = "larger",
    lower: str = "smaller",
    load_average: float | None = None,
    cores: int | None = None,
) -> str:
    """``higher`` or ``lower`` when ``value`` differs from ``reference_value`` by more than the larger spread and
    ``floor`` on a machine that is not busy; else "within the noise" or "no conclusion (busy machine)"."""
    if busy(load_average, cores):
        return "no conclusion (busy machine)"
    if abs(value - reference_value) <= max(spread, reference_spread, floor):
        return "within the noise"
    return higher if value > reference_value else lower


def reference(name: str) -> dict | None:
    """The committed result of ``benchmarks/<name>.py`` (``benchmarks/results/<name>.json``), or None if absent
    (an installed package without the repository's benchmarks)."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def machine_line(result: dict | None) -> str:
    """Where and under what load a reference ran: '2 cores, torch 2.13.0+cpu, 2026-12-04, load average 1.4'."""
    if result is None:
        return "no reference run committed here (run the benchmark to make one)"
    m = result.get("machine", {})
    date = m.get("date") or result.get("date") or "date not recorded"
    loads = m.get("loadavg_before")
    load_text = f"load average {loads[0]:.1f} before the run" if loads else "load not recorded (a shared machine)"
    return f"{m.get('cores', '?')} cores, torch {m.get('torch', '?')}, {str(date)[:10]}, {load_text}"
