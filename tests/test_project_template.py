"""A fourth project is one folder and one register line (issue 49): the template (``simlib/projects/template/``, a
small MLP on scikit-learn's diabetes data) copied into a temporary folder, registered, and then everything that
lists projects finds it: ``simlib train --quick`` (2 ranks), its ``--dry-run``, ``--size gpu --dry-run`` (no GPU
size declared: the full size, said in one line), ``simlib plan`` and its milestone's graded check. No file of the
repository is touched: the copy lives in a temporary folder, and its registration ends with this module."""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import cloudpickle
import pytest

from simlib import cli, grading
from simlib.projects import registry, runner

TEMPLATE = Path(__file__).resolve().parents[1] / "simlib" / "projects" / "template"
NAME = "diabetes"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The template copied to <tmp>/newcomer_diabetes/ and registered as ``diabetes``; undone after the module."""
    import importlib.util

    folder = tmp_path_factory.mktemp("newcomer") / "newcomer_diabetes"
    shutil.copytree(TEMPLATE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    # imported from its folder without touching sys.path (a new sys.path would cost the workers a fresh zygote)
    spec = importlib.util.spec_from_file_location("newcomer_diabetes", folder / "__init__.py")
    package = importlib.util.module_from_spec(spec)
    sys.modules["newcomer_diabetes"] = package
    spec.loader.exec_module(package)
    cloudpickle.register_pickle_by_value(package)  # the workers get the task by value: no path to set up there
    try:
        yield registry.register(NAME, "newcomer_diabetes.run", "an MLP on the diabetes data (the template)")
    finally:
        registry.PROJECTS.pop(NAME, None)
        grading.EXERCISES.pop(f"{NAME}_milestone", None)
        cloudpickle.unregister_pickle_by_value(package)
        for mod in [m for m in sys.modules if m.startswith("newcomer_diabetes")]:
            del sys.modules[mod]


def test_the_template_trains_through_simlib_train(project, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", NAME, "--quick", "--out", str(out)]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    steps = project.settings(True)["steps"]
    assert summary["world_size"] == 2 and summary["steps"] == steps
    assert summary["final_eval"]["eval_loss"] < 1.0  # better than predicting the mean
    assert "run record in" in capsys.readouterr().out


def test_the_template_has_dry_runs_and_a_plan(project, capsys):
    assert cli.main(["train", NAME, "--quick", "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "nothing is started" in out and "plan dp: dp2" in out and "not priced" not in out  # priced: sim_spec()
    assert cli.main(["train", NAME, "--size", "gpu", "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "declares no GPU size" in out and "its full size runs" in out
    assert project.size("gpu")["task"] == project.settings(False)["task"]
    assert cli.main(["plan", NAME, "--quick", "--cluster", "h100", "--devices", "2"]) == 0, capsys.readouterr().err
    assert "MLP 16x2 on the diabetes data" in capsys.readouterr().out


def test_the_template_milestone_is_graded(project, cluster2):
    exercise = grading.milestone(NAME)
    assert exercise == f"{NAME}_milestone" and exercise in grading.EXERCISES
    record, state = runner.run_project(NAME, 2, quick=True, cluster=cluster2, verbose=False)
    task = project.settings(True)["task"]
    report = grading.check(exercise, (task, record, state), clusters={2: cluster2}, quiet=True)
    assert report.passed, "\n".join(r.line() for r in report.results)
    assert grading.check(exercise, None, quiet=True).status == "not implemented"
    longer, longer_state = runner.run_project(NAME, 2, quick=True, cluster=cluster2, verbose=False, steps=80)
    # weights of a longer run beside the shorter run's record, its last evaluation edited to what they score
    last = dict(record.evals[-1], eval=longer.evals[-1]["eval"])
    edited = dataclasses.replace(record, evals=record.evals[:-1] + [last])
    report = grading.check(exercise, (task, edited, longer_state), clusters={2: cluster2}, quiet=True)
    assert not report.passed and "not the end of the run" in " ".join(r.hint for r in report.failed()), report
