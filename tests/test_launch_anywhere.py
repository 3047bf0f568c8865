"""simlib.launch from every place a learner calls it, and its start-up failures.

The workers are started as a command (as torchrun does), so they never re-import the caller's ``__main__``:
a script without the ``if __name__ == "__main__":`` guard, a script on standard input and ``python -c`` work
as well as a guarded script and IPython. (The notebook case is in ``test_kernel.py``.)
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import simlib

ROOT = Path(__file__).resolve().parents[1]

BODY = textwrap.dedent("""
    import simlib, torch, torch.distributed as dist
    def total(x):
        t = torch.tensor([float(x + dist.get_rank())])
        dist.all_reduce(t)
        return t.item()
""")
CALL = "print('RESULT', simlib.launch(total, 2, 10))\n"
GUARDED = BODY + "if __name__ == '__main__':\n    " + CALL
UNGUARDED = BODY + CALL


def _run(args, tmp_path, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("how", ["guarded script", "unguarded script", "python -c", "stdin", "ipython"])
def test_launch_from_anywhere(how, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(GUARDED if how == "guarded script" else UNGUARDED)
    if how.endswith("script"):
        args, stdin = [sys.executable, str(script)], None
    elif how == "python -c":
        args, stdin = [sys.executable, "-c", UNGUARDED], None
    elif how == "stdin":  # python - <<EOF, as in shell scripts and CI
        args, stdin = [sys.executable, "-"], UNGUARDED
    else:  # IPython, not in a kernel: functions defined at its prompt travel by value
        ipy = tmp_path / "job.ipy"
        ipy.write_text(UNGUARDED)
        args, stdin = [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=nocolor", str(ipy)], None
    code, out, err = _run(args, tmp_path, stdin)
    assert code == 0, err[-3000:]
    assert "RESULT [21.0, 21.0]" in out
    assert "bootstrapping phase" not in err and "FileNotFoundError" not in err


def test_startup_failure_is_one_short_message(monkeypatch):
    """A worker that dies before it connects: the rank, the exit code and the last lines it wrote; not the
    elastic agent's report (its empty error_file, its documentation link)."""
    monkeypatch.setenv("SIMLIB_ZYGOTE", "0")  # the agent starts the bootstrap itself (a fork never re-imports)
    module = sys.modules["simlib.agent"]  # where the workers are started
    monkeypatch.setattr(
        module,
        "BOOTSTRAP",
        "import sys; print('importing'); raise ImportError('no module named simlib_missing (on purpose)')",
    )
    with pytest.raises(simlib.WorkerError) as info:
        simlib.launch(print, 2)
    text = str(info.value)
    assert text.startswith("the 2 workers could not start")
    assert "rank 0 ended while starting" in text and "rank 1 ended while starting" in text
    # whichever rank failed first shows its exit code and last lines (the agent may stop the other one)
    assert "(exit code 1):" in text and "ImportError: no module named simlib_missing (on purpose)" in text
    assert "error_file" not in text and "pytorch.org" not in text
    assert len(text.splitlines()) <= 12
    assert sorted(info.value.failures) == [0, 1]


def test_unpicklable_capture_names_the_variable(cluster2):
    import threading

    lock = threading.Lock()
    with pytest.raises(TypeError) as info:
        cluster2.run(lambda: lock.locked())
    assert "the variable `lock` it captures (a lock) cannot be pickled" in str(info.value)
    with pytest.raises(TypeError) as info:
        cluster2.run(lambda: cluster2.world_size)  # the cluster itself
    text = str(info.value)
    assert "`cluster2`" in text and "a Cluster of 2 worker(s) lives in the calling process" in text
    with pytest.raises(TypeError, match="argument 0 .a lock."):
        cluster2.run(print, lock)
    assert cluster2.run(lambda: 1) == [1, 1]  # nothing was sent, the cluster is as it was


def test_remote_traceback_shows_learner_frames_only(cluster2):
    def inner():
        raise KeyError("missing on purpose")

    def outer():
        inner()

    with pytest.raises(simlib.WorkerError) as info:
        cluster2.run(outer)
    tb = info.value.failures[0].traceback
    assert "worker.py" not in tb  # simlib's worker loop is plumbing, not the learner's
    assert tb.index("in outer") < tb.index("in inner") and 'raise KeyError("missing on purpose")' in tb


def test_a_dropped_cluster_stops_its_workers(alive):
    import gc
    import time

    cluster = simlib.Cluster(1)
    pids = cluster.pids
    del cluster  # no thread of simlib's keeps it alive
    gc.collect()
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
