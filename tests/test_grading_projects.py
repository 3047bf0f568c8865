"""The projects' milestones: a real 2-rank run passes; each planted wrong answer fails with a hint that points at it."""
import pytest

from simlib import grading

from planted import projects as planted

HINTS = {"untrained": ("train longer", "untrained HedgeNet"), "single_process": ("data parallelism",),
         "over_budget": ("fewer steps",), "stale_running_stats": ("running averages",),
         "trained_on_test_split": ("smaller holdout",), "look_ahead": ("leaks the future",),
         "no_costs": ("with costs",)}


@pytest.fixture(scope="module")
def answers(cluster2):
    from simlib.projects.runner import run_project
    out = {}
    for name in ("vision", "finance"):
        record, state = run_project(name, 2, quick=True, cluster=cluster2, verbose=False)
        out[name] = (_task(name), record, state)
    return out


def _task(name):
    from simlib.projects.runner import PROJECTS
    return PROJECTS[name](True)["task"]


@pytest.mark.parametrize("name", ["vision", "finance"])
def test_real_run_passes_and_planted_bugs_fail(answers, name):
    exercise = f"{name}_milestone"
    report = grading.check(exercise, answers[name], quiet=True)
    assert report.passed, "\n".join(r.line() for r in report.results)
    for bug in (planted.VISION if name == "vision" else planted.FINANCE):
        report = grading.check(exercise, bug(*answers[name]), quiet=True)
        assert not report.passed, bug.__name__
        hints = " ".join(r.hint for r in report.failed())
        assert any(h in hints for h in HINTS[bug.__name__]), (bug.__name__, hints)


def test_wrong_shape_of_answer_is_reported():
    report = grading.check("vision_milestone", "my model", quiet=True)
    assert report.status == "error" and "(task, record, state)" in report.results[-1].detail
