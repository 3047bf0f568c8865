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


_LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _no_world_left_behind(request):
    """A test that starts a one-process world in this process and forgets to end it would make every later test
    (and every notebook kernel, which inherits this environment) believe a launcher started it. Such a test's
    world is ended and its launcher variables removed after it, with a warning naming it. Worlds a wider-scoped
    fixture holds are left alone: they exist before the test starts."""
    import warnings

    import torch.distributed as dist
    before = {k: os.environ.get(k) for k in _LAUNCH_KEYS}
    had_world = dist.is_available() and dist.is_initialized()
    yield
    if had_world:
        return
    leaked = [k for k in _LAUNCH_KEYS if os.environ.get(k) != before[k]]
    if dist.is_available() and dist.is_initialized():
        import simlib
        simlib.shutdown()
        leaked.append("a process group")
    for k in _LAUNCH_KEYS:
        if before[k] is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = before[k]
    if leaked:
        warnings.warn(f"{request.node.nodeid} left {', '.join(leaked)} behind (cleaned up); "
                      "use the one_process fixture", stacklevel=1)


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
