"""Time limits that scale with the machine, and a busy machine never called a hang (issue 51).

A check's limit is the grader's base limit (quiet machine) times how busy the machine is *now*, measured two
ways at the moment of the run: the 1-minute load average per core (``os.getloadavg``), and a calibration run here,
:mod:`simlib.pace`'s spinning thread timed by the wall clock and by its CPU clock (``wall / cpu``: 1 when this
process has a core to itself, 3 when it gets a third of one; the library's one calibration). No reference time is
written into the code: the calibration compares the machine with itself. A run that trips its limit is retried once, with the machine re-measured and
at least twice the limit, and the learner is told "your machine was busy (load X on N cores)" before anything is
called a hang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import pace


def cores() -> int:
    """The cores this process may use (:mod:`simlib.pace`'s count)."""
    return pace.pace().cores


def contention() -> float:
    """Wall time over CPU time of a spinning thread just now (>= 1): how much of a core it got. One calibration
    for the whole library: :func:`simlib.pace.pace`, measured afresh."""
    return pace.pace(refresh=True).slowdown


@dataclass
class Load:
    """How busy the machine is at one moment."""

    load: float  # 1-minute load average (runnable processes)
    cores: int
    contention: float  # wall / cpu of the calibration loop
    ranks: int = 1  # the worker processes the run will use

    @classmethod
    def now(cls, ranks: int = 1, refresh: bool = False) -> Load:
        """The machine now: :mod:`simlib.pace`'s calibration (at most 10 s old; measured afresh when ``refresh``,
        as a run that tripped its limit does before its second chance)."""
        p = pace.pace(refresh=refresh, max_age=10.0)
        return cls(0.0 if math.isnan(p.load) else p.load, p.cores, p.slowdown, ranks)

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
