"""simlib.launch and simlib.Cluster: results, environment, output, and every failure rule."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from worlds import limit, load_note

import simlib
from simlib import env


def _rank_info(tag):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return dict(tag=tag, sum=t.item(), threads=torch.get_num_threads(), **{k: os.environ.get(k) for k in keys})


def test_launch_returns_results_and_torchrun_environment():
    out = simlib.launch(_rank_info, 2, "x")
    assert [o["RANK"] for o in out] == ["0", "1"]
    assert all(o["WORLD_SIZE"] == "2" and o["sum"] == 3.0 and o["tag"] == "x" for o in out)
    assert [o["LOCAL_RANK"] for o in out] == ["0", "1"]
    assert all(o["MASTER_ADDR"] == "127.0.0.1" and int(o["MASTER_PORT"]) > 0 for o in out)
    assert all(o["threads"] == env.threads_per_worker(2) for o in out)


def test_warm_cluster_runs_closures_and_is_fast(cluster2):
    base = 10

    def add(x):  # a closure, shipped by value with cloudpickle
        return base + x + dist.get_rank()

    assert cluster2.run(add, 1) == [11, 12]
    t0 = time.perf_counter()
    for _ in range(3):
        assert cluster2.run(lambda: dist.get_world_size()) == [2, 2]
    assert (time.perf_counter() - t0) / 3 < 1.0


def test_output_is_prefixed_whole_lines(cluster2, capsys):
    def talk():
        for i in range(3):
            print(f"line {i} from {dist.get_rank()}")
        print("to stderr", file=sys.stderr)

    cluster2.run(talk)
    out, err = capsys.readouterr()
    for rank in (0, 1):
        for i in range(3):
            assert f"[rank{rank}] line {i} from {rank}\n" in out
        assert f"[rank{rank}] to stderr\n" in err


def test_exception_names_rank_and_traceback_and_cluster_recovers(cluster2):
    def fail_on_one():
        if dist.get_rank() == 1:
            raise ValueError("bad value on purpose")
        dist.barrier()  # rank 0 waits for rank 1, which never comes

    t0 = time.perf_counter()
    with pytest.raises(simlib.WorkerError) as info:
        cluster2.run(fail_on_one)
    assert time.perf_counter() - t0 < 10
    err = info.value
    assert err.ranks == [1]
    assert "rank 1: ValueError: bad value on purpose" in str(err)
    tb = err.failures[1].traceback  # the closure travelled by value; its file and source line are restored
    assert "test_launch.py" in tb and 'raise ValueError("bad value on purpose")' in tb
    assert "next call starts fresh ones" in str(err)
    assert cluster2.run(lambda: dist.get_rank()) == [0, 1]  # restarted on demand


@pytest.mark.parametrize("signame, words", [("SIGSEGV", "segmentation fault"), ("SIGKILL", "out-of-memory killer")])
def test_worker_killed_by_a_signal_names_it(cluster2, signame, words):
    def die(name):
        import os
        import signal

        if dist.get_rank() == 1:
            os.kill(os.getpid(), getattr(signal, name))  # a crash in native code, or the OOM killer
        time.sleep(0.5)  # rank 0 stays alive; it is the dead rank that must be named

    with pytest.raises(simlib.WorkerError) as info:
        cluster2.run(die, signame)
    failure = info.value.failures[1]
    assert failure.type_name == "WorkerDied"
    assert f"killed by {signame}" in failure.message and words in failure.message
    assert f"rank 1: WorkerDied: killed by {signame}" in str(info.value)
    assert cluster2.run(lambda: 3) == [3, 3]


def test_describe_exit():
    from simlib.errors import describe_exit

    assert describe_exit(-11).startswith("killed by SIGSEGV")
    assert "out-of-memory" in describe_exit(-9)
    assert "code 3" in describe_exit(3) and "without reporting" in describe_exit(None)


def test_exception_on_every_rank_keeps_cluster_warm(cluster2):
    pids = cluster2.pids
    with pytest.raises(simlib.WorkerError) as info:
        cluster2.run(lambda: 1 / 0)
    assert info.value.ranks == [0, 1] and "ZeroDivisionError" in str(info.value)
    assert cluster2.pids == pids  # every rank reported and the barrier check passed: same processes
    assert cluster2.run(lambda: 5) == [5, 5]


def test_mismatched_collective_times_out_clearly():
    def mismatch():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(4))  # rank 1 never joins
        return dist.get_rank()

    with simlib.Cluster(2, timeout=3) as cluster:
        t0 = time.perf_counter()
        with pytest.raises(simlib.WorkerTimeout) as info:
            cluster.run(mismatch)
        assert time.perf_counter() - t0 < limit(15), load_note()  # 15 s on an idle machine, scaled
        assert "rank 0" in str(info.value) and "timeout=3" in str(info.value)
        assert info.value.results == {1: 1}
        assert cluster.run(lambda: "alive") == ["alive", "alive"]


def test_call_timeout_stops_a_hang_and_leaves_no_orphan(cluster2, alive):
    pids = cluster2.pids
    with pytest.raises(simlib.WorkerTimeout) as info:
        cluster2.call(time.sleep, (60,), timeout=2)
    assert "did not finish" in str(info.value)
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)]
    assert cluster2.run(lambda: 1) == [1, 1]


@pytest.mark.parametrize("bad", [0, -1, 2.0, "2", True, None])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size"):
        simlib.launch(lambda: 1, bad)


def test_bad_backend_and_nccl_without_gpus():
    with pytest.raises(ValueError, match="unknown backend"):
        simlib.Cluster(2, backend="mpi")
    if env.gpu_count() < 2:
        with pytest.raises(ValueError, match="one GPU per rank"):
            simlib.launch(lambda: 1, 2, backend="nccl")


def test_bad_timeout_and_fn():
    with pytest.raises(ValueError, match="timeout"):
        simlib.Cluster(1, timeout=-1)
    with simlib.Cluster(1) as cluster:
        with pytest.raises(ValueError, match="callable"):
            cluster.run(42)
    assert cluster.run(lambda: 7) == [7]  # a closed cluster starts its workers again on the next call
    cluster.close()


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, simlib
    # Ctrl-C as a terminal delivers it: a parent that ignores SIGINT passes the ignore on through exec (bash does
    # that to a background job, so a CI runner started with `&` made this script deaf to the signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    def sleepy(path):
        open(f"{path}.{os.environ['RANK']}", "w").close()  # this rank is inside the call
        time.sleep(120)
    if __name__ == "__main__":
        cluster = simlib.Cluster(2)
        open(sys.argv[1], "w").write(" ".join(map(str, cluster.pids)))
        try:
            cluster.run(sleepy, sys.argv[1])
        except KeyboardInterrupt:
            print("interrupted cleanly", flush=True)
            sys.exit(3)
""")


def _start_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(pidfile)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    running = [tmp_path / f"pids.{rank}" for rank in (0, 1)]  # both workers are inside the call (a loaded machine
    while not (pidfile.exists() and pidfile.read_text().strip() and all(p.exists() for p in running)):  # may lag)
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    time.sleep(0.2)
    return proc, [int(p) for p in pidfile.read_text().split()]


def test_ctrl_c_stops_every_worker(tmp_path, alive):
    proc, pids = _start_script(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 3, err
    assert "interrupted cleanly" in out and "stopped all 2 workers" in err
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)]


def test_killed_caller_leaves_no_orphan(tmp_path, alive):
    proc, pids = _start_script(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.time() + 10
    while [p for p in pids if alive(p)] and time.time() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


def test_after_a_call_messages_of_restarted_workers_are_kept():
    """A call that fails ends its loop, then empties the queue; workers the elastic agent has already restarted
    may have connected by then. Their messages must wait for _await_workers: a dropped connection closes, the new
    worker exits, and the restart fails with "the workers exited before they joined" (seen in a loaded CI run)."""
    import queue

    from simlib.launch import Cluster

    cluster = Cluster.__new__(Cluster)  # no workers needed: only the queue and the stash
    cluster._queue, cluster._stash, printed = queue.Queue(), [], []
    cluster._print = printed.append
    messages = [
        ("out", 0, "text"),
        ("conn", "a new worker's connection"),
        ("ready", 1),
        ("fatal", 0, "failure"),
        ("result", 0, 7, True, b""),
        ("eof", 1, None),
    ]
    for msg in messages:
        cluster._queue.put(msg)
    cluster._drain()
    assert printed == [messages[0]]
    assert cluster._stash == messages[1:4]  # stale results and EOFs of the old workers are dropped


def test_elastic_logs_stay_quiet_while_any_cluster_runs():
    """Clusters overlap (a notebook's cluster2 and cluster4): the first agent to end used to give torch's elastic
    loggers their levels back while the second ran, and that one's intended shutdown printed "failed (exitcode:
    -9)" in red. Quiet while any agent runs; the levels come back when the last ends."""
    import logging

    from simlib.agent import _quiet_elastic

    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")  # where "failed (exitcode" is logged
    before = logging.getLogger("torch.distributed.elastic").level
    enabled_before = log.isEnabledFor(logging.ERROR)  # False while a session's warm cluster runs (the suite's)
    first, second = _quiet_elastic(), _quiet_elastic()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not log.isEnabledFor(logging.ERROR), "the second cluster's agent still runs: its stop must stay quiet"
    second.__exit__(None, None, None)
    assert logging.getLogger("torch.distributed.elastic").level == before
    assert log.isEnabledFor(logging.ERROR) == enabled_before  # as it was: untouched outside every Cluster's agent
