"""What the tests share beyond fixtures: one rank trained in the test process (the conftest's fixtures use it), and
time limits that scale with how busy this machine is (``limit``, ``patiently``; :mod:`simlib.pace`).

A test's time limit is stated for an idle machine and scaled by the calibration :mod:`simlib.pace` makes at its
first use in the session (a spinning thread's wall / CPU time) and makes again when a limit trips: on a laptop
doing other things a right answer takes longer, and a fixed limit would call it a hang.
"""

import os
from contextlib import contextmanager


@contextmanager
def one_process_world():
    """Training in this process (one rank, no launcher): its process group and the environment variables that made
    it go after (for a module-scoped fixture, which cannot use the ``one_process`` fixture)."""
    import simlib

    saved = dict(os.environ)
    try:
        yield
    finally:
        simlib.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def limit(seconds: float) -> float:
    """``seconds`` (enough on this machine idle) scaled to how busy it is now (:func:`simlib.pace.scaled`)."""
    from simlib import pace  # here, not at import: the conftest imports this module before torch is wanted

    return pace.scaled(seconds)


def patiently(run, seconds: float, what: str = "the test's call", timeouts: tuple = (TimeoutError,)):
    """``run(limit)`` with ``seconds`` scaled to the machine; when it trips: re-measured, said (a
    :class:`simlib.pace.BusyMachineWarning` with the load) and run once more with a longer limit; a second trip
    fails the test with the load in its message (:func:`simlib.pace.patiently`)."""
    from simlib import pace

    return pace.patiently(run, seconds, what, timeouts)


def load_note() -> str:
    """``load 9.3 on 2 cores: work runs 4.1x slower than on idle cores``, measured now."""
    from simlib import pace

    return pace.pace(refresh=True).note()
