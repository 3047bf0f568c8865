"""Time limits that scale with the machine, and a busy machine never called a hang (issue 51).

A check's limit is the grader's base limit (quiet machine) times how busy the machine is *now*, measured two
ways at the moment of the run: the 1-minute load average per core (``os.getloadavg``), and a calibration run here,
a short fixed loop timed by the wall clock and by this thread's CPU clock (``wall / cpu``: 1 when this process has
a core to itself, 3 when it gets a third of one). No reference time is written into the code: the calibration
compares the machine with itself. A run that trips its limit is retried once, with the machine re-measured and
at least twice the limit, and the learner is told "your machine was busy (load X on N cores)" before anything is
called a hang.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def contention(work: int = 20000) -> float:
    """Wall time over CPU time of a short fixed loop in this thread (>= 1): how much of a core it got just now."""
    best = float("inf")
    for _ in range(3):  # the least contended of three tries: one preemption is not a busy machine
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        total = 0
        for i in range(work):
            total += i * i % 7
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        if cpu > 0:
            best = min(best, wall / cpu)
    return max(1.0, best if best != float("inf") else 1.0)


@dataclass
class Load:
    """How busy the machine is at one moment."""

    load: float  # 1-minute load average (runnable processes)
    cores: int
    contention: float  # wall / cpu of the calibration loop
    ranks: int = 1  # the worker processes the run will use

    @classmethod
    def now(cls, ranks: int = 1) -> Load:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
        return cls(load, cores(), contention(), ranks)

    @property
    def factor(self) -> float:
        """How many times longer than on a quiet machine a run may take now (>= 1)."""
        return max(1.0, self.load / self.cores, self.contention)

    def sentence(self, limit: float) -> str:
        return (
            f"your machine was busy (load {self.load:.1f} on {self.cores} cores, this process got "
            f"1/{self.contention:.1f} of a core): the run was given a second chance with a limit of {limit:.0f} s"
        )


def limit_for(base: float, load: Load, retry: bool = False) -> float:
    """The limit for a run: ``base`` (quiet machine) times the load factor; a retry gets at least twice that."""
    limit = base * load.factor
    return limit * 2 if retry else limit
