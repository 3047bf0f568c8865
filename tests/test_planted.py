"""Every exercise has at least three planted wrong versions (CONTRIBUTING.md, "Add an exercise").

Whether each is caught, with a hint that points at the bug, is tested per lesson (tests/test_grading*.py); here:
that none is missing, whatever exercise is added next.
"""

import importlib
from pathlib import Path

import nbformat
import pytest
from planted import PLANTED_IN  # noqa: E402

from simlib import grading
from simlib.exercises import exercises_of

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = sorted(
    {
        e["exercise"]
        for path in (ROOT / "solutions").glob("[0-9]*.ipynb")
        for e in exercises_of(nbformat.read(str(path), as_version=4))
    }
)


def _planted(exercise):
    module_name, attribute = PLANTED_IN[exercise]
    versions = getattr(importlib.import_module(f"planted.{module_name}"), attribute)
    return list(versions.values()) if isinstance(versions, dict) else list(versions)


def test_there_are_exercises():
    assert len(EXERCISES) >= 7


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_exercise_has_three_planted_wrong_versions(exercise):
    assert exercise in grading.EXERCISES, f"{exercise}: no checks registered with @grading.exercise"
    assert exercise in PLANTED_IN, (
        f"{exercise}: add its planted wrong versions to tests/planted/ and name them in "
        "tests/planted/__init__.py PLANTED_IN (see CONTRIBUTING.md)"
    )
    versions = _planted(exercise)
    assert len(versions) >= 3, f"{exercise}: {len(versions)} planted wrong versions, at least 3 wanted"
    assert len({id(v) for v in versions}) == len(versions), f"{exercise}: a planted version is listed twice"


def test_every_registry_entry_resolves():
    for exercise in PLANTED_IN:
        assert exercise in grading.EXERCISES, f"PLANTED_IN names {exercise!r}, which has no registered checks"
        assert _planted(exercise)


def test_the_contributing_guide_has_each_recipe():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for heading in (
        "## The lesson template",
        "## Add a lesson",
        "## Add an exercise",
        "## Add a hardware preset",
        "## Add a project",
        "## Grade a class",
    ):
        assert heading in text
    assert "PLANTED_IN" in text and "### BEGIN SOLUTION" in text and "SIMLIB_QUICK=1" in text


MILESTONES = ("gpt_plan", "vision_milestone", "finance_milestone")


@pytest.mark.parametrize("exercise", MILESTONES)
def test_a_milestone_left_empty_is_not_done_yet(exercise):
    """A milestone starts empty and says "not done yet" (issue 19): no answer is pre-filled, none passes."""
    assert exercise in grading.EXERCISES and exercise in PLANTED_IN
    for empty in (None, ""):
        report = grading.check(exercise, empty, quiet=True)
        assert report.status == "not implemented" and not report.passed, report
        assert "not done yet" in report.results[-1].hint


def test_notebook_milestone_cells_start_empty():
    nb = nbformat.read(str(ROOT / "notebooks" / "10_project_gpt.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and 'grading.check("gpt_plan"' in c.source)
    assert "my_plan = None" in cell.source, cell.source
