"""The learner-mistake benchmark cannot rot: every exercise has its mistakes, every file loads, the proof harness
runs (on the exercises that need no worker processes), and the summary counts what it should. No grading runs."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "mistakes")]
import grader_mistakes as gm  # noqa: E402


def _parsed(path):
    tree = ast.parse(path.read_text())
    names = {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    return ast.get_docstring(tree) or "", names


def test_every_exercise_has_ten_honest_mistakes_with_a_docstring():
    exercises = gm.exercises()
    assert len(exercises) >= 15, sorted(exercises)
    for exercise in exercises:
        files = gm.mistake_files(exercise)
        honest = 0
        for f in files:
            doc, names = _parsed(f)
            assert {"KIND", "PROVE", "ANSWER"} <= names, f"{f}: needs KIND, PROVE and ANSWER"
            assert doc and "\n" not in doc and doc.startswith(("Honest: ", "Deliberate: ")), f"{f}: one-line docstring"
            honest += doc.startswith("Honest: ")
        assert honest >= 10, f"{exercise}: {honest} honest mistakes, at least 10 wanted"


def test_every_answer_loads_and_says_its_kind():
    for f in gm.mistake_files():
        item = gm.load(f, f.parent.name)
        assert item["kind"] in ("honest", "deliberate"), f
        assert item["doc"].lower().startswith(item["kind"]), f"{f}: the docstring and KIND disagree"
        assert callable(item["answer"]) or isinstance(item["answer"], tuple), f
        assert isinstance(item["prove"], dict), f
        if f.parent.name not in ("one_f_one_b", "checkpoint_placement", "plan_memory"):
            assert item["prove"].get("world_size", 0) >= 2, f"{f}: a distributed proof names its world size"
    for exercise in gm.exercises():  # the solutions the proofs compare with load too
        assert gm.load("solution", exercise)["answer"] is not None


@pytest.mark.parametrize("exercise", ["plan_memory", "checkpoint_placement", "one_f_one_b"])
def test_prove_shows_every_local_mistake_differs_from_the_solution(exercise):
    results = gm.prove({exercise: gm.mistake_files(exercise)}, timeout=30)[exercise]
    assert results and all(r["proved"] for r in results.values()), {k: r for k, r in results.items() if not r["proved"]}


def test_prove_reports_an_answer_equal_to_the_solution_as_not_proved(tmp_path, monkeypatch):
    src = gm.solution_source("plan_memory")
    fake = tmp_path / "plan_memory" / "same_as_solution.py"
    fake.parent.mkdir()
    fake.write_text(
        '"""Honest: the solution itself."""\nKIND = "honest"\nPROVE = {"model": [4, 256, 4], '
        '"strategy": {"dp": 2}}\n' + src + "\nANSWER = plan_memory\n"
    )
    assert not gm.prove({"plan_memory": [fake]}, timeout=30)["plan_memory"]["same_as_solution"]["proved"]


def test_differences_tolerates_rounding_and_sees_values():
    assert gm.differences({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 + 1e-9]}) == []
    assert gm.differences({"a": [1.0, 2.0]}, {"a": [1.0, 2.1]})
    assert gm.differences([{"error": "x"}], [{"ok": 1}])
    assert gm.differences({"a": 1.0}, {"a": 1.0 + 1e-9}, tol=1e-12)


def test_summary_counts_caught_only_when_caught_every_time_and_flags_flaky_verdicts():
    graded = {
        "ex": {
            "solution": dict(kind="solution", doc="", verdicts=["passed", "passed", "caught"]),
            "a": dict(kind="honest", doc="", verdicts=["caught", "caught", "caught"]),
            "b": dict(kind="honest", doc="", verdicts=["caught", "passed", "caught"]),
            "c": dict(kind="deliberate", doc="", verdicts=["hang", "caught", "caught"]),
        }
    }
    row = gm.summarise(graded)["ex"]
    assert (row["honest_caught"], row["honest_total"], row["tricks_caught"], row["tricks_total"]) == (1, 2, 1, 1)
    assert (row["solution_passes"], row["solution_runs"]) == (2, 3)
    assert len(row["flaky"]) == 3 and len(row["hangs"]) == 1
