"""Two "nodes" on one machine: two torchrun agents (2 ranks each) meet by c10d rendezvous on 127.0.0.1 and run
`simlib train gpt` as one world of 4 with a DP x TP plan, TP inside a node; equal to one process. Then one node
is killed (its agent and workers, as a machine dies) and replaced: the survivors' agent restarts its workers,
the new node joins, and the run resumes from its checkpoint to the same losses.

The commands are `docs/machines.md`'s ("Same code, bigger machine"), with a shorter budget.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from worlds import limit

from simlib import checkpoint, cli, env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # `torchrun`, with this interpreter (a copied venv's
# torchrun script may point at another one)
STEPS = ["--budget.steps", "10", "--budget.log-every", "1", "--budget.eval-every", "10"]  # room to kill a node mid-run
PLAN = ["--plan.dp", "2", "--plan.tp", "2"]
TOL = dict(rel=1e-5, abs=1e-5)  # as tests/test_train.py: fp32 sums in another order across TP shards


def _losses(folder: Path) -> list:
    rows = [json.loads(line) for line in (folder / "run.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _clean_env():
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK", "TORCHELASTIC", "GROUP_"))
    }
    e.update(
        SIMLIB_QUICK="1",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        # torch 2.13's c10d rendezvous shares one TCPStore across rounds by default, and then a replacement
        # node cannot join: the surviving rank-0 agent publishes MASTER_ADDR/PORT under the first round's
        # prefix only (it caches them: DynamicRendezvousHandler.next_rendezvous, _bootstrap_store_info), and
        # the new agent waits for them under the new round's prefix until it times out (seen here without
        # this: "wait timeout after 60000ms, keys: /torch.rendezvous.simlib-two-nodes.1/MASTER_ADDR", both
        # agents fail). Without sharing, every round publishes them.
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    return e


def _agent(node: int, endpoint: str, out: Path, log: Path, extra=(), steps=STEPS) -> subprocess.Popen:
    """One node: a torchrun agent with 2 local ranks (in a session of its own, as are its workers: see _node)."""
    cmd = [
        *TORCHRUN,
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--node-rank",
        str(node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "simlib-two-nodes",
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "1",
        "-m",
        "simlib",
        "train",
        "gpt",
        "--quick",
        *PLAN,
        "--out",
        str(out),
        *steps,
        *extra,
    ]
    return subprocess.Popen(
        cmd, env=_clean_env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=out.parent
    )


def _node(agent_pid: int) -> list:
    """A "node": the agent and every process under it. Not its process group: torch's agent starts each worker
    in a session of its own (subprocess_handler.py, start_new_session=True), so killing the agent's group leaves
    its workers training on. Read from /proc (Linux, as torchrun's multi-node launch)."""
    children = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [agent_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _kill_node(agent: subprocess.Popen) -> None:
    """Kill a node as a machine dies: SIGKILL to its agent and workers, nothing cleaned up."""
    if agent.poll() is None:
        _signal(_node(agent.pid), signal.SIGSTOP)  # frozen first: a stopped agent cannot start another worker
        _signal(_node(agent.pid), signal.SIGKILL)
    agent.wait()


def _listening(port: int) -> bool:
    """Whether a socket listens on ``port`` (read from /proc/net, without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "0A" for r in rows):  # 0A: LISTEN
            return True
    return False


def _start_nodes(tmp_path, out, extra=(), steps=STEPS):
    endpoint = f"127.0.0.1:{env.free_port()}"
    first = _agent(0, endpoint, out, tmp_path / "node0.log", extra, steps)
    # On 127.0.0.1 every agent may host the rendezvous store: the first to bind the port does. Node 0 must (the
    # test kills node 1), so node 1 starts once the port listens (a fixed pause lost that race on a loaded box).
    port, deadline = int(endpoint.rsplit(":", 1)[1]), time.monotonic() + 120
    while not _listening(port):
        assert first.poll() is None, (tmp_path / "node0.log").read_text()[-2500:]
        assert time.monotonic() < deadline, "node 0's agent did not open the rendezvous port within 120 s"
        time.sleep(0.1)
    return endpoint, [first, _agent(1, endpoint, out, tmp_path / "node1.log", extra, steps)]


def _wait(procs, tmp_path, timeout=300):
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            _kill_node(p)  # a node still running after the timeout: agent and workers, no orphans
    logs = "\n".join(f"--- {f.name}\n" + f.read_text()[-2500:] for f in sorted(tmp_path.glob("node*.log")))
    assert all(p.returncode == 0 for p in procs), logs
    return logs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: the same run in one process (`--world-size 1 --plan single`)."""
    out = tmp_path_factory.mktemp("one") / "gpt"
    assert (
        cli.main(["train", "gpt", "--quick", "--world-size", "1", "--plan", "single", "--out", str(out), *STEPS]) == 0
    )
    return _losses(out)


def _kill_after_a_checkpoint(node, out: Path, others, timeout=240) -> int:
    """Kill ``node`` (agent and workers) once a checkpoint is written, at a known point of the run: the node is
    frozen (SIGSTOP) while the checkpoints are read, so the others cannot finish meanwhile (the next DP
    all-reduce waits for it), then killed; between looks it runs. Returns the newest step checkpointed."""
    timeout = limit(timeout)  # for an idle machine: scaled to how busy it is now
    deadline = time.monotonic() + timeout
    while not (out / "run.jsonl").is_file():  # workers still starting: no need to freeze yet
        assert all(p.poll() is None for p in (node, *others)), "a node ended before training began"
        assert time.monotonic() < deadline, f"no training step within {timeout} s"
        time.sleep(0.2)
    while True:
        assert all(p.poll() is None for p in (node, *others)), "a node ended before the first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint within {timeout} s"
        pids = _node(node.pid)
        _signal(pids, signal.SIGSTOP)
        found = checkpoint.list_checkpoints(out / "checkpoints")
        if found:
            _kill_node(node)
            return found[-1][0]
        _signal(pids, signal.SIGCONT)
        time.sleep(0.05)


@pytest.mark.slow
def test_two_nodes_equal_one_process_and_a_dead_node_is_replaced(one_process, tmp_path):
    """Two nodes run one world of 4 with a DP x TP plan; kill node 1 (agent and workers) after a checkpoint; a new
    node 1 joins; the run resumes, and every step's loss, before the kill and after, equals one process's.

    (One test, one two-node run: the run up to the kill is the two-node run a test of its own made before, at
    the cost of a second run of the same command, ~25 s.)"""
    out = tmp_path / "gpt"
    extra = ["--plan.checkpoint-every", "2", "--resume"]
    endpoint, procs = _start_nodes(tmp_path, out, extra)
    try:
        killed_at = _kill_after_a_checkpoint(procs[1], out, procs[:1])
        procs.append(_agent(1, endpoint, out, tmp_path / "node1b.log", extra))  # same command
        logs = _wait([procs[0], procs[2]], tmp_path)
    finally:
        for p in procs:
            _kill_node(p)
    steps_total = int(STEPS[1])
    assert killed_at < steps_total, f"the run had finished (checkpoint {killed_at}) before node 1 was killed"
    resumed = re.findall(r"--resume: continuing from \S*step_(\d+)", (tmp_path / "node0.log").read_text())
    assert len(resumed) == 1 and killed_at <= int(resumed[0]) < steps_total, logs  # the survivors restarted once
    assert json.loads((out / "summary.json").read_text())["world_size"] == 4
    config = (out / "config.toml").read_text()
    assert "dp = 2" in config and "tp = 2" in config
    # one rank 0 of a world of 4 in each round (the first, and the one after node 1 was replaced): never a node
    # that believes it is a world of its own
    said = "".join(f.read_text() for f in sorted(tmp_path.glob("node*.log")))
    assert said.count("plan dp (dp2 tp2) on rank 0 of 4 started by torchrun") == 2, logs
    rows = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    final = {r["step"]: r["loss"] for r in rows if "loss" in r}  # a step logged twice (lost after the checkpoint): last
    assert sorted(final) == list(range(steps_total))
    assert [final[s] for s in range(steps_total)] == pytest.approx(one_process, **TOL)


@pytest.mark.slow
def test_one_node_torchrun_is_one_world(one_process, tmp_path):
    """`torchrun --nproc-per-node 2 -m simlib train gpt --quick`: one world of 2, one output folder."""
    out = tmp_path / "gpt"
    done = subprocess.run(
        [
            *TORCHRUN,
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(env.free_port()),
            "-m",
            "simlib",
            "train",
            "gpt",
            "--quick",
            "--out",
            str(out),
            *STEPS,
        ],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("plan dp (dp2) on rank 0 of 2 started by torchrun") == 1, done.stdout[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt"]
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    assert _losses(out) == pytest.approx(one_process, **TOL)
