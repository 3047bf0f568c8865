"""How fast this machine runs work right now, and time limits that scale with it.

A fixed time limit blames the learner for the machine: on a laptop running a browser and a video call a right
answer can take five times as long as on an idle one, and "your code hangs" would then be false. So a limit is
stated for an idle machine and scaled by a measurement made here, now:

    pace()                  the calibration (a :class:`Pace`): measured at first use, kept for ``max_age`` s
    pace(refresh=True)      measured again (what a limit that trips does before it says anything)
    scaled(30)              30 s on an idle machine -> the seconds the same work may take on this one now
    patiently(run, 30)      run(limit); when it trips: re-measure, retry once with a longer limit and say that the
                            machine was busy (load X on N cores); only a second trip is a hang, and it says the load

The calibration: one thread spins for a fixed wall-clock window and reads the CPU time it got. On an idle core the
two are equal; when R runnable threads share C cores each gets about C/R of a core, so wall / CPU is the factor by
which CPU-bound work (a check, a test, a worker) takes longer now than on this machine idle. It needs no figure
from another machine: the reference is this machine's own idle speed, measured against itself at this moment.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass

__all__ = ["Pace", "pace", "scaled", "patiently", "BusyMachineWarning", "BUSY"]

WINDOW = 0.25  # seconds of wall clock the calibration spins for (the same whatever the load)
BUSY = 1.5  # slower than this (wall / CPU) counts as busy: said in messages, and limits grow by it


class BusyMachineWarning(UserWarning):
    """A time limit tripped on a busy machine and the work was given a longer one."""


@dataclass(frozen=True)
class Pace:
    """One calibration: ``slowdown`` (wall / CPU seconds of a spinning thread, >= 1), the 1-minute load average
    and the cores this process may use, and when it was measured (``time.monotonic``)."""

    slowdown: float
    load: float
    cores: int
    at: float

    @property
    def busy(self) -> bool:
        return self.slowdown >= BUSY

    def note(self) -> str:
        """``load 9.3 on 2 cores: work runs 4.1x slower than on idle cores`` (the second part only when busy)."""
        said = f"load {self.load:.1f} on {self.cores} core{'s' * (self.cores != 1)}"
        return said + (f": work runs {self.slowdown:.1f}x slower than on idle cores" if self.busy else "")


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return float("nan")


def measure(window: float = WINDOW) -> Pace:
    """Spin for ``window`` seconds of wall clock; the slowdown is wall / the CPU time this thread got."""
    t0, c0 = time.perf_counter(), time.thread_time()
    x = 0
    while time.perf_counter() - t0 < window:
        for _ in range(2000):
            x += 1
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    slowdown = max(1.0, wall / max(cpu, 1e-3)) if cpu > 0 else 50.0
    from .env import cpu_count  # the cores this process may use (its affinity mask)

    return Pace(round(min(slowdown, 50.0), 2), _load(), cpu_count(), time.monotonic())


_last: Pace | None = None
_lock = threading.Lock()


def pace(refresh: bool = False, max_age: float = 60.0) -> Pace:
    """The calibration: measured at first use, again when ``refresh`` or when older than ``max_age`` seconds."""
    global _last
    with _lock:
        if refresh or _last is None or time.monotonic() - _last.at > max_age:
            _last = measure()
        return _last


def scaled(seconds: float, now: Pace | None = None) -> float:
    """``seconds`` (a limit for this work on an idle machine) times the slowdown measured now (never less)."""
    return float(seconds) * max(1.0, (now or pace()).slowdown)


def patiently(run, limit: float, what: str = "the work", timeouts: tuple = (TimeoutError,), retry: bool = True):
    """``run(seconds)`` with a limit scaled to this machine; when it raises one of ``timeouts``: measure again,
    warn that the machine was busy (its load) and run it once more with a longer limit (at least twice the first).
    A second trip is re-raised with the load added to it, so a "hang" verdict always says how busy the machine
    was. ``run`` must be safe to repeat (a check, a test's call); the learner's own code is never re-run here."""
    first = scaled(limit)
    try:
        return run(first)
    except timeouts as exc:
        now = pace(refresh=True)
        if not retry:
            _add_note(exc, f"{what} ran past {first:.0f} s ({now.note()})")
            raise
        longer = max(2 * first, 2 * scaled(limit, now))
        warnings.warn(
            f"{what} ran past {first:.0f} s; your machine was busy ({now.note()}): trying once more with "
            f"{longer:.0f} s before calling it a hang",
            BusyMachineWarning,
            stacklevel=2,
        )
    try:
        return run(longer)
    except timeouts as exc:
        _add_note(exc, f"{what} ran past {first:.0f} s and, once more, past {longer:.0f} s ({pace(True).note()})")
        raise


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(note)
