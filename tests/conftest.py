"""Shared fixtures: warm clusters, started once per test session (a cold start costs seconds here)."""

import os

import pytest
from worlds import limit, one_process_world  # limit: 20 s on an idle machine, scaled (simlib.pace)


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


_SESSION_ENV = {k: os.environ.get(k) for k in _LAUNCH_KEYS}  # as the session found it: no launcher's world


def _end_leaked_world(before: dict) -> list:
    """End a process group left in this process and put the launcher variables back as in ``before``; what leaked."""
    import torch.distributed as dist

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
    return leaked


@pytest.fixture(autouse=True)
def _no_world_left_behind(request):
    """A test that starts a one-process world in this process and forgets to end it would make every later test
    (and every notebook kernel, which inherits this environment) believe a launcher started it. Such a test's
    world is ended and its launcher variables removed after it, with a warning naming it. A world that was there
    when the test started came from a module's fixture: ``_no_world_left_by_a_module`` ends it with the module."""
    import warnings

    import torch.distributed as dist

    before = {k: os.environ.get(k) for k in _LAUNCH_KEYS}
    had_world = dist.is_available() and dist.is_initialized()
    yield
    if had_world:
        return
    leaked = _end_leaked_world(before)
    if leaked:
        warnings.warn(
            f"{request.node.nodeid} left {', '.join(leaked)} behind (cleaned up); use the one_process fixture",
            stacklevel=1,
        )


@pytest.fixture(scope="module", autouse=True)
def _no_world_left_by_a_module(request):
    """After a module (its module-scoped fixtures torn down first): no process group in this process and the
    launcher variables as the session found them; a module that leaves either is cleaned up after and named."""
    import warnings

    yield
    leaked = _end_leaked_world(_SESSION_ENV)
    if leaked:
        warnings.warn(
            f"{request.node.nodeid} (a test or a module-scoped fixture in it) left {', '.join(leaked)} "
            "behind (cleaned up); use the one_process fixture",
            stacklevel=1,
        )


@pytest.fixture(scope="session")
def cluster2():
    import simlib

    cluster = simlib.Cluster(2, timeout=limit(20))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster3():
    """World size 3 (not a power of two): the grader checks every exercise on it."""
    import warnings

    import simlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        cluster = simlib.Cluster(3, timeout=limit(20))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster4():
    import warnings

    import simlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        cluster = simlib.Cluster(4, timeout=limit(20))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def clusters(cluster2, cluster3, cluster4):
    """The grader's worlds: every exercise is checked on 2, 3 and 4 ranks ({world size: warm cluster})."""
    return {2: cluster2, 3: cluster3, 4: cluster4}


@pytest.fixture
def one_process():
    """A test that trains in this process: its process group and the environment variables that made it go after."""
    with one_process_world():
        yield


@pytest.fixture(scope="session")
def vision_quick_run(cluster2):
    """The vision project's standard quick run on 2 ranks, as a learner passes it to its milestone: (task, record,
    state). One run for the session: tests/test_grading_projects.py and tests/test_project_milestones.py both grade
    it (each planted answer is built on copies; nothing changes these)."""
    from simlib.projects.runner import project_settings, run_project

    task = project_settings("vision", "quick")["task"]
    record, state = run_project("vision", 2, quick=True, cluster=cluster2, verbose=False)
    return task, record, state
