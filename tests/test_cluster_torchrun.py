"""Two "nodes" on one machine: two torchrun agents (2 ranks each) meet by c10d rendezvous on 127.0.0.1 and run
`simlib train gpt` as one world of 4 with a DP x TP plan, TP inside a node; equal to one process. Then one node
is killed (its agent and workers, as a machine dies) and replaced: the survivors' agent restarts its workers,
the new node joins, and the run resumes from its checkpoint to the same losses.

The commands are the README's ("Same code, bigger machine"), with a shorter budget.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simlib import checkpoint, cli, env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # `torchrun`, with this interpreter (a copied venv's
                                                           # torchrun script may point at another one)
STEPS = ["--budget.steps", "6", "--budget.log-every", "1", "--budget.eval-every", "6"]
PLAN = ["--plan.dp", "2", "--plan.tp", "2"]
TOL = dict(rel=1e-5, abs=1e-5)  # as tests/test_train.py: fp32 sums in another order across TP shards


def _losses(folder: Path) -> list:
    rows = [json.loads(line) for line in (folder / "run.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _clean_env():
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK", "TORCHELASTIC", "GROUP_"))}
    e.update(SIMLIB_QUICK="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
             # torch 2.13's c10d rendezvous shares one TCPStore across rounds by default, and then a replacement
             # node cannot join: the surviving rank-0 agent does not publish MASTER_ADDR for the new round, and the
             # new agent waits for it until it times out (seen here). Without sharing, every round publishes it.
             TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return e


def _agent(node: int, endpoint: str, out: Path, log: Path, extra=()) -> subprocess.Popen:
    """One node: a torchrun agent with 2 local ranks, in its own session (killing the session kills the node)."""
    cmd = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", endpoint, "--rdzv-id", "simlib-two-nodes", "--local-addr", "127.0.0.1",
           "--max-restarts", "1", "-m", "simlib", "train", "gpt", "--quick", *PLAN, "--out", str(out), *STEPS,
           *extra]
    return subprocess.Popen(cmd, env=_clean_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=out.parent)


def _start_nodes(tmp_path, out, extra=()):
    endpoint = f"127.0.0.1:{env.free_port()}"
    first = _agent(0, endpoint, out, tmp_path / "node0.log", extra)
    time.sleep(2)  # node 0 hosts the rendezvous store: let it bind before node 1 connects
    return endpoint, [first, _agent(1, endpoint, out, tmp_path / "node1.log", extra)]


def _wait(procs, tmp_path, timeout=300):
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = "\n".join(f"--- {f.name}\n" + f.read_text()[-2500:] for f in sorted(tmp_path.glob("node*.log")))
    assert all(p.returncode == 0 for p in procs), logs
    return logs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: the same run in one process (`--world-size 1 --plan single`)."""
    out = tmp_path_factory.mktemp("one") / "gpt"
    assert cli.main(["train", "gpt", "--quick", "--world-size", "1", "--plan", "single", "--out", str(out),
                     *STEPS]) == 0
    return _losses(out)


@pytest.mark.slow
def test_two_nodes_dp_by_tp_equal_one_process(one_process, tmp_path):
    out = tmp_path / "gpt"
    _, procs = _start_nodes(tmp_path, out)
    logs = _wait(procs, tmp_path)
    assert logs.count("plan dp (dp2 tp2) on rank 0 of 4 started by torchrun") == 1, logs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 4
    config = (out / "config.toml").read_text()
    assert "dp = 2" in config and "tp = 2" in config
    assert _losses(out) == pytest.approx(one_process, **TOL)


@pytest.mark.skip(reason="not working yet: the replacement node resumes from the checkpoint and reaches the "
                  "reference's loss, but the surviving agent then fails at exit with a torch elastic error that has "
                  "not been diagnosed (issue 24 stays open for it)")
@pytest.mark.slow
def test_a_node_dies_and_is_replaced(one_process, tmp_path):
    """Kill node 1 (agent and workers) after the first checkpoint; a new node 1 joins; the run resumes."""
    out = tmp_path / "gpt"
    extra = ["--plan.checkpoint-every", "2", "--resume"]
    endpoint, (node0, node1) = _start_nodes(tmp_path, out, extra)
    deadline = time.monotonic() + 240
    while not checkpoint.list_checkpoints(out / "checkpoints") and time.monotonic() < deadline:
        assert node0.poll() is None and node1.poll() is None, "a node ended before the first checkpoint"
        time.sleep(0.05)
    assert checkpoint.list_checkpoints(out / "checkpoints"), "no checkpoint within 240 s"
    os.killpg(node1.pid, signal.SIGKILL)  # the whole node: agent and its two workers
    node1.wait()
    replacement = _agent(1, endpoint, out, tmp_path / "node1b.log", extra)
    logs = _wait([node0, replacement], tmp_path, timeout=600)  # failure detection + a new rendezvous: slow
    assert "--resume: continuing from" in logs, logs
    losses = _losses(out)  # run.jsonl: the steps before the checkpoint, then the resumed ones (appended)
    steps = [json.loads(line)["step"] for line in (out / "run.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    final = {s: loss for s, loss in zip(steps, losses)}  # a step logged twice (lost after the checkpoint): last
    assert sorted(final) == list(range(6))
    assert [final[s] for s in range(6)] == pytest.approx(one_process, **TOL)


@pytest.mark.slow
def test_one_node_torchrun_is_one_world(one_process, tmp_path):
    """`torchrun --nproc-per-node 2 -m simlib train gpt --quick`: one world of 2, one output folder."""
    out = tmp_path / "gpt"
    done = subprocess.run([*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                           str(env.free_port()), "-m", "simlib", "train", "gpt", "--quick", "--out", str(out), *STEPS],
                          env=_clean_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("plan dp (dp2) on rank 0 of 2 started by torchrun") == 1, done.stdout[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt"]
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    assert _losses(out) == pytest.approx(one_process, **TOL)
