"""Backend/device choice and the torchrun/SLURM entry points (same code, bigger machine)."""

import os
import subprocess
import sys
import textwrap

import pytest

from simlib import env

JOB = textwrap.dedent("""
    import torch, torch.distributed as dist, simlib
    def main():
        ctx = simlib.init(timeout=30)
        t = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(t)
        print(f"OK rank={ctx.rank} world={ctx.world_size} local={ctx.local_rank} launcher={ctx.launcher} "
              f"backend={ctx.backend} sum={t.item():g}", flush=True)
""")


def test_pick_backend_and_device():
    assert env.pick_backend("gloo", 4) == "gloo"
    if env.gpu_count() == 0:
        assert env.pick_backend("auto", 2) == "gloo"
        assert str(env.pick_device("gloo", 1)) == "cpu"
    with pytest.raises(ValueError):
        env.pick_backend("ucc")
    assert env.threads_per_worker(4, cores=2) == 1 and env.threads_per_worker(1, cores=8) == 8


def test_detect_launcher():
    assert env.detect_launcher({}) == "single"
    assert env.detect_launcher({"RANK": "0", "WORLD_SIZE": "2"}) == "torchrun"
    assert env.detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}) == "slurm"
    # the batch script of an sbatch job sees SLURM_PROCID=0 and SLURM_NTASKS but is no job step: not a rank
    assert env.detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}) == "single"
    assert env.detect_launcher({"SIMLIB_WORKER": "1", "RANK": "0", "WORLD_SIZE": "2"}) == "simlib"


def test_slurm_nodelist():
    assert env._slurm_first_host_fallback("gpu[003-005,9],cpu1") == "gpu003"
    assert env._slurm_first_host_fallback("node7") == "node7"


@pytest.fixture
def job_module(tmp_path):
    (tmp_path / "simjob.py").write_text(JOB)
    return tmp_path


def _env(cwd, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    e["PYTHONPATH"] = str(cwd)
    e.update(extra)
    return e


def test_same_function_under_torchrun(job_module):
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # this interpreter (a copied venv's script may not be)
    out = subprocess.run(
        [
            *torchrun,
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(env.free_port()),
            "-m",
            "simlib",
            "run",
            "simjob:main",
        ],
        cwd=job_module,
        env=_env(job_module),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for rank in (0, 1):
        assert f"OK rank={rank} world=2 local={rank} launcher=torchrun backend=gloo sum=3" in out.stdout


def test_same_function_under_slurm_variables(job_module):
    """Two tasks as ``srun -n 2`` would start them: only SLURM's variables, no RANK/MASTER_*."""
    port = str(env.free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "simlib", "run", "simjob:main"],
            cwd=job_module,
            env=_env(
                job_module,
                SLURM_PROCID=str(r),
                SLURM_NTASKS="2",
                SLURM_LOCALID=str(r),
                SLURM_STEP_ID="0",
                SLURM_NTASKS_PER_NODE="2",
                SLURM_JOB_NODELIST="127.0.0.1",
                SLURM_JOB_ID="1234",
                MASTER_PORT=port,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for rank, (stdout, stderr) in enumerate(outs):
        assert procs[rank].returncode == 0, stderr
        assert f"OK rank={rank} world=2 local={rank} launcher=slurm backend=gloo sum=3" in stdout


def test_simlib_run_locally(job_module):
    out = subprocess.run(
        [sys.executable, "-m", "simlib", "run", "simjob:main", "--nproc-per-node", "2"],
        cwd=job_module,
        env=_env(job_module),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "[rank1] OK rank=1 world=2 local=1 launcher=simlib backend=gloo sum=3" in out.stdout


def test_same_function_under_torchrun_two_nodes(job_module):
    """Two torchrun agents on one machine stand in for two nodes (c10d rendezvous on loopback)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # this interpreter (a copied venv's script may not be)
    endpoint = f"127.0.0.1:{env.free_port()}"
    procs = [
        subprocess.Popen(
            [
                *torchrun,
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "simlibtest",
                "--local-addr",
                "127.0.0.1",
                "-m",
                "simlib",
                "run",
                "simjob:main",
            ],
            cwd=job_module,
            env=_env(job_module),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    stdout = "".join(o for o, _ in outs)
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    for rank in (0, 1):
        assert f"OK rank={rank} world=2 local=0 launcher=torchrun backend=gloo sum=3" in stdout


def test_init_in_a_plain_process_makes_a_one_rank_group(tmp_path):
    code = (
        "import simlib, torch, torch.distributed as dist; ctx = simlib.init(); t = torch.ones(1); "
        "dist.all_reduce(t); print(ctx.launcher, ctx.rank, ctx.world_size, t.item()); simlib.shutdown()"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["single", "0", "1", "1.0"]


def test_gpu_topology_reports_the_matrix_or_why_not():
    import subprocess
    from types import SimpleNamespace

    from simlib import env

    matrix = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    ok = lambda *a, **k: SimpleNamespace(returncode=0, stdout=matrix, stderr="")  # noqa: E731
    assert "NV18" in env.gpu_topology(run=ok)

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    assert env.gpu_topology(run=missing) == "nvidia-smi not found: interconnect unknown"
    failed = lambda *a, **k: SimpleNamespace(returncode=9, stdout="", stderr="NVML: driver not loaded")  # noqa: E731
    assert "driver not loaded" in env.gpu_topology(run=failed)

    def hangs(*a, **k):
        raise subprocess.TimeoutExpired("nvidia-smi", 20)

    assert env.gpu_topology(run=hangs).startswith("nvidia-smi topo -m failed")


def test_doctor_prints_gpu_fields(capsys):
    from simlib import cli

    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in ("nccl_version", "gpu_memory_gib", "interconnect", "default_backend"):
        assert key in out
