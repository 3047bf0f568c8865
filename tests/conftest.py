"""Shared fixtures: warm clusters, started once per test session (a cold start costs seconds here)."""
import os

import pytest

os.environ.setdefault("SIMLIB_QUICK", "1")


@pytest.fixture(scope="session")
def cluster2():
    import simlib
    cluster = simlib.Cluster(2, timeout=20)
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
