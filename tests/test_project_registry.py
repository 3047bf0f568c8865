"""A project is registered once (issue 34, part 2): one module with TASK and settings(), one register() line, and
``simlib train`` (choices, --task.* flags, [task] table, the run, the dry run) and the runner find it. This file
is the fourth project: a linear regression, trained for real in this process (world size 1, a second or so)."""

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from simlib import cli, config
from simlib.plan import OptimConfig
from simlib.projects import registry, runner


@dataclass
class TinyTask:
    name: str = "tiny"
    global_batch: int = 8  # samples per step
    width: int = 4  # inputs of the linear model
    seed: int = 0

    def build_model(self):
        torch.manual_seed(self.seed)
        return nn.Linear(self.width, 1)

    def batch(self, step: int):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(self.global_batch, self.width, generator=g)
        return x, x.sum(1, keepdim=True)

    def loss(self, output, target):
        return nn.functional.mse_loss(output, target)

    def evaluate(self, model) -> dict:
        x, y = self.batch(10**6)
        return {"eval_loss": float(self.loss(model(x), y))}


TASK = TinyTask


def settings(quick: bool = False) -> dict:
    return dict(
        task=TinyTask(),
        steps=6 if quick else 40,
        eval_every=3,
        log_every=1,
        optim=OptimConfig(name="sgd", lr=0.05),
        target={"eval_loss": 1e9},
    )


@pytest.fixture
def tiny(monkeypatch):
    from simlib import env

    monkeypatch.setattr(registry, "PROJECTS", dict(registry.PROJECTS))  # the registration ends with the test
    monkeypatch.setattr(runner, "PROJECTS", registry.PROJECTS)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):  # what a one-process run sets: undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield registry.register("tiny", __name__, "a linear regression (the test's)")
    env.shutdown()  # the one-process run's process group


def test_a_registered_project_trains_through_the_cli(tiny, tmp_path, capsys):
    assert "tiny" in config.task_classes() and any(f.flag == "--task.width" for f in config.fields("task"))
    out = tmp_path / "tiny"
    assert (
        cli.main(
            [
                "train",
                "tiny",
                "--quick",
                "--world-size",
                "1",
                "--plan",
                "single",
                "--task.width",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    ), capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["final_eval"]["eval_loss"] > 0
    assert "width = 3" in (out / "config.toml").read_text()  # the flag reached the task
    assert "run record in" in capsys.readouterr().out
    import os

    import torch.distributed as dist

    assert "RANK" not in os.environ and not dist.is_initialized()  # the one-process run left nothing behind
    record, state = runner.run_project("tiny", 1, quick=True, verbose=False)  # the runner finds it too
    assert set(state) == {"weight", "bias"} and record.summary["steps"] == 6
    assert runner.PROJECTS["tiny"](True)["task"] == TinyTask()  # what the grader's _standard(name) reads


def test_a_registered_project_has_a_dry_run(tiny, capsys):
    assert cli.main(["train", "tiny", "--quick", "--world-size", "2", "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "nothing is started" in out and "plan dp: dp2" in out and "dp groups: [0, 1]" in out
    assert "not priced" in out  # no sim_spec(): validated and mapped, not priced
    assert cli.main(["train", "tiny", "--quick", "--world-size", "2", "--plan.tp", "2", "--dry-run"]) == 2
    assert "has no tensor_parallel()" in capsys.readouterr().err


def test_an_unknown_project_names_the_registered_ones(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "nope"])
    assert "gpt" in capsys.readouterr().err
    with pytest.raises(ValueError, match="use one of gpt, vision, finance"):
        registry.get("nope")
