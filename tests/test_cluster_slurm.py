"""A real one-node SLURM (munged + slurmctld + slurmd in a temp dir): `srun -n 2 simlib train gpt --quick` and the
repository's sbatch file each give ONE world of 2 and one output folder, with the losses of the simlib.launch run.

Skipped, with the reason, where SLURM cannot start (not installed, no permission to run its daemons). The
commands are `docs/machines.md`'s ("Same code, bigger machine"), with a shorter budget.
"""

import json
import os
import sys
from pathlib import Path

import pytest
from cluster_daemons import SlurmCluster, SlurmUnavailable

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--budget.steps", "4", "--budget.log-every", "1", "--budget.eval-every", "4"]  # the quick GPT, 4 steps


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.__enter__()
    except SlurmUnavailable as exc:
        pytest.skip(f"SLURM cannot start here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`simlib train gpt --quick --world-size 2` on the laptop path (simlib.launch), same budget."""
    from simlib import cli

    out = tmp_path_factory.mktemp("ref") / "gpt"
    assert cli.main(["train", "gpt", "--quick", "--world-size", "2", "--out", str(out), *SHORT]) == 0
    return _losses(out)


def _losses(folder: Path) -> list:
    rows = [json.loads(line) for line in (folder / "run.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _check_one_world(folder: Path, stdout: str, reference: list) -> None:
    assert stdout.count("simlib train gpt: plan dp (dp2) on rank 0 of 2 started by slurm") == 1, stdout[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert {p.name for p in folder.iterdir()} >= {"run.jsonl", "summary.json", "config.toml", "loss.png"}
    losses = _losses(folder)
    assert len(losses) == len(reference) == 4
    assert losses == pytest.approx(reference, rel=1e-6, abs=1e-6), (losses, reference)


def _env():
    return {"PYTHON": sys.executable, "SIMLIB_QUICK": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
def test_srun_two_tasks_are_one_world(slurm, reference, tmp_path):
    out = tmp_path / "gpt"
    done = slurm.run(
        ["srun", "-n", "2", sys.executable, "-m", "simlib", "train", "gpt", "--quick", "--out", str(out), *SHORT],
        cwd=tmp_path,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _check_one_world(out, done.stdout, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt"]  # one output folder, nothing else written


@pytest.mark.slow
def test_sbatch_file_from_the_repo(slurm, reference, tmp_path):
    out = tmp_path / "gpt"
    log = tmp_path / "job.out"
    done = slurm.run(
        [
            "sbatch",
            "--wait",
            f"--output={log}",
            str(ROOT / "examples/slurm/train_gpt.sbatch"),
            "--out",
            str(out),
            *SHORT,
        ],
        cwd=tmp_path,
        env=_env(),
    )
    text = log.read_text() if log.exists() else ""
    assert done.returncode == 0, (done.stdout + done.stderr + text)[-3000:]
    _check_one_world(out, text, reference)


def test_world_size_that_contradicts_the_launcher_is_one_line(capsys, monkeypatch):
    """Under srun -n 2, `--world-size 4` is an error naming both sizes (no SLURM needed: its variables)."""
    from simlib import cli

    for key, value in dict(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_STEP_ID="0", SLURM_LOCALID="0").items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SIMLIB_WORKER"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["train", "gpt", "--quick", "--world-size", "4", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--world-size 4" in err and "world of 2" in err and "srun -n 4" in err
    assert cli.main(["scaling", "--world-sizes", "1", "2", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "one world of 2" in err
    assert os.environ["SLURM_NTASKS"] == "2"
