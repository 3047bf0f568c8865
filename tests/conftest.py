"""Shared fixtures: warm clusters, started once per test session (a cold start costs seconds here)."""
import os

import pytest


def _alive(pid: int) -> bool:
    """Is ``pid`` a running process (a zombie counts as dead)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def alive():
    """``alive(pid)``: whether a worker process is still running (for the no-orphan checks)."""
    return _alive

os.environ.setdefault("SIMLIB_QUICK", "1")


@pytest.fixture(scope="session")
def cluster2():
    import simlib
    cluster = simlib.Cluster(2, timeout=20)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster3():
    """World size 3 (not a power of two): the grader checks every exercise on it."""
    import warnings

    import simlib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        cluster = simlib.Cluster(3, timeout=20)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster4():
    import warnings

    import simlib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        cluster = simlib.Cluster(4, timeout=20)
    yield cluster
    cluster.close()


@pytest.fixture
def one_process():
    """A test that trains in this process: its process group and the environment variables that made it go after."""
    import simlib
    saved = dict(os.environ)
    yield
    simlib.shutdown()
    os.environ.clear()
    os.environ.update(saved)
