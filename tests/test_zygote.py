"""CPU workers forked from a zygote (``simlib.zygote``): the same workers as a fresh start, the launcher's exit is
the worker's, nobody outlives whom they must not, and the ordinary start where the zygote is not used."""

import os
import signal
import sys
import time

import pytest

import simlib
from simlib import zygote

pytestmark = pytest.mark.skipif(not zygote.enabled("gloo", "cpu"), reason="the zygote is Linux-only")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _facts():
    import random

    import numpy as np
    import torch
    import torch.distributed as dist

    return dict(
        pid=os.getpid(),
        rank=dist.get_rank(),
        env=os.environ.get("SIMLIB_TEST_ZYGOTE"),
        cwd=os.getcwd(),
        launcher=int(os.environ.get("SIMLIB_LAUNCHER_PID", os.getpid())),
        threads=torch.get_num_threads(),
        draws=(random.random(), float(np.random.rand())),
        torch_draw=float(torch.rand(1)),
        session=os.getsid(0),
    )


def test_workers_fork_from_the_zygote_and_are_what_a_fresh_start_gives(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SIMLIB_TEST_ZYGOTE", "first")
    with simlib.Cluster(2, threads=1) as c:
        facts = c.run(_facts)
        address = zygote.address()
        parents = [_parent(f["pid"]) for f in facts]
    assert [f["rank"] for f in facts] == [0, 1]
    assert parents == [address["pid"]] * 2, "the workers are the zygote's children"
    for f in facts:
        assert f["env"] == "first" and f["cwd"] == str(tmp_path) and f["threads"] == 1
        assert f["session"] == f["pid"], "a session of its own, as the agent starts its workers"
        assert f["launcher"] != f["pid"]
    assert facts[0]["draws"][0] != facts[1]["draws"][0] and facts[0]["draws"][1] != facts[1]["draws"][1], (
        "Python's and NumPy's generators are reseeded per worker"
    )
    assert facts[0]["torch_draw"] != facts[1]["torch_draw"], "torch's too (a fresh process seeds it from the OS)"
    # the environment changed: a new zygote imports with it; the old one ends once its workers have
    monkeypatch.setenv("SIMLIB_TEST_ZYGOTE", "second")
    with simlib.Cluster(2, threads=1) as c:
        again = c.run(_facts)
        assert zygote.address()["pid"] != address["pid"]
    assert [f["env"] for f in again] == ["second", "second"]
    assert again[0]["draws"] != facts[0]["draws"]
    deadline = time.time() + 10
    while _alive(address["pid"]) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(address["pid"]), "the retired zygote ended with its last worker"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_launcher_exits_as_its_worker_did(cluster2):
    """The agent reads the launcher's exit: an exit code, a signal, a SIGTERM passed on."""
    import torch.distributed as dist

    def leave(how):
        if dist.get_rank() == 1:
            if how == "exit":
                os._exit(7)
            os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(0.5)

    with pytest.raises(simlib.WorkerError, match="exited with code 7"):
        cluster2.run(leave, "exit")
    with pytest.raises(simlib.WorkerError, match="killed by SIGABRT"):
        cluster2.run(leave, "abort")
    assert cluster2.run(lambda: 1) == [1, 1]


def test_a_killed_launcher_takes_its_worker_and_a_sigterm_reaches_it(alive):
    with simlib.Cluster(2, threads=1) as c:
        launchers = dict(c._exit_pids)
        workers = dict(c._pids)
        os.kill(launchers[0], signal.SIGKILL)  # as the agent's last resort, or a user's kill -9
        os.kill(launchers[1], signal.SIGTERM)  # as the agent's stop: passed on to the worker
        deadline = time.time() + 10
        while any(alive(p) for p in workers.values()) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers.values())
        with pytest.raises(simlib.WorkerError) as info:
            c.run(lambda: 1)
        assert "SIGTERM" in str(info.value) or "SIGKILL" in str(info.value)
        assert c.run(lambda: 2) == [2, 2]


def test_a_dead_zygote_takes_its_workers_and_the_next_start_makes_another(alive, monkeypatch):
    monkeypatch.setenv("SIMLIB_TEST_ZYGOTE", "its own")  # a zygote of its own: the session's clusters keep theirs
    c = simlib.Cluster(2, threads=1)
    try:
        old = zygote.address()["pid"]
        workers = c.pids
        zygote.stop()
        deadline = time.time() + 10
        while any(alive(p) for p in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "workers die with their zygote"
        with pytest.raises(simlib.WorkerError, match="killed by SIGKILL"):
            c.run(lambda: 1)
        assert c.run(lambda: 2) == [2, 2]
        assert _parent(c.pids[0]) == zygote.address()["pid"] != old
    finally:
        c.close()


def test_without_the_zygote_the_agent_starts_workers_itself(monkeypatch):
    monkeypatch.setenv("SIMLIB_ZYGOTE", "0")
    with simlib.Cluster(2, threads=1) as c:
        facts = c.run(_facts)
        parents = [_parent(f["pid"]) for f in facts]
    assert all(f["launcher"] == f["pid"] for f in facts) and parents == [os.getpid()] * 2
    assert not zygote.enabled("nccl", "auto") and not zygote.enabled("gloo", "cuda:0")


def test_an_unreachable_zygote_means_an_ordinary_start(monkeypatch):
    """The launcher runs the worker itself when the zygote is gone (here: its socket path points nowhere)."""
    real = zygote.address
    monkeypatch.setattr(zygote, "address", lambda: {**real(), "path": "/nonexistent/socket", "pid": 1 << 22})
    with simlib.Cluster(2, threads=1) as c:
        parents = [_parent(pid) for pid in c.pids]
    assert parents == [os.getpid()] * 2


def test_a_one_shot_launch_starts_no_zygote_but_uses_one_that_is_there():
    """``simlib.launch`` in a fresh process: its workers import side by side (a zygote's import would come first,
    then the fork); once a Cluster made one, a launch forks from it too."""
    import subprocess

    code = (
        "import os, simlib\nfrom simlib import zygote\n"
        "parent = lambda: int(open(f'/proc/{os.getpid()}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "print(simlib.launch(parent, 2, threads=1) == [os.getpid()] * 2, zygote._current is None)\n"
        "c = simlib.Cluster(2, threads=1)\n"
        "print(set(simlib.launch(parent, 2, threads=1)) == {zygote.address()['pid']})\nc.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True", "True"], out.stdout + out.stderr[-2000:]
