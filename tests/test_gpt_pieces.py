"""The GPT project's learner pieces (simlib/projects/gpt/run.py PIECES): they run inside the GPT's training on every
rank, the course's own pieces give the run without pieces, a wrong piece changes the run or stops it with a clear
error, and the checks catch the planted wrong pieces (solutions/10_gpt_pieces.ipynb)."""

import os

import cloudpickle
import pytest
from planted import gpt_pieces as planted

from simlib import grading
from simlib.exercises import load_answers

cloudpickle.register_pickle_by_value(planted)  # sent as a notebook cell's code would travel

STEPS = 3  # a few steps of the quick GPT under Plan(dp=2, tp=2): enough to see the pieces' numbers


def _run(cluster4, pieces, steps=STEPS):
    from simlib.projects.gpt import run as gpt
    from simlib.projects.runner import run_project

    record, _ = run_project(
        "gpt",
        4,
        quick=True,
        verbose=False,
        plan=gpt.pieces_plan(),
        steps=steps,
        eval_every=0,
        log_every=1,
        pieces=pieces,
        cluster=cluster4,
    )
    return record


def _losses(record):
    return [float(x) for x in record.frame["loss"]]


@pytest.fixture(scope="module")
def solution():
    from pathlib import Path

    answers = load_answers(Path(__file__).resolve().parents[1] / "solutions" / "10_gpt_pieces.ipynb")
    return {"grad_sync": answers["BucketSync"], "tp_attention": answers["TPAttention"]}


def test_given_and_learner_pieces_run_inside_training_and_equal_the_run_without(cluster4, solution):
    from simlib.projects.gpt import run as gpt

    none = _run(cluster4, {})
    given = _run(cluster4, {name: slot.load_given() for name, slot in gpt.PIECES.items()})
    mine = _run(cluster4, solution)
    assert none.summary["pieces"] == [] and given.summary["pieces"] == mine.summary["pieces"] == sorted(gpt.PIECES)
    assert _losses(given) == _losses(none)  # the course's own pieces through the slots: the very same run
    assert _losses(mine) == pytest.approx(_losses(none), rel=1e-5)  # the solution computes the same thing


def test_a_wrong_piece_changes_the_run(cluster4, solution):
    right = _losses(_run(cluster4, solution, steps=2))
    bias_twice = _losses(_run(cluster4, {**solution, "tp_attention": planted.BiasOnEveryRank}, steps=2))
    world_not_group = _losses(_run(cluster4, {**solution, "grad_sync": planted.IgnoresTheGroup}, steps=2))
    # the GPT's biases start at zero: added twice they change nothing at step 0, from step 1 on the forward differs
    assert bias_twice[0] == pytest.approx(right[0], rel=1e-6)
    assert bias_twice[1] != pytest.approx(right[1], rel=1e-4)
    assert world_not_group[0] == pytest.approx(right[0], rel=1e-6)  # same start, then averaged over the wrong ranks
    assert world_not_group[1] != pytest.approx(right[1], rel=1e-4)


def test_a_class_without_group_is_refused_under_a_mesh_naming_the_cause(cluster4):
    from simlib.launch import WorkerError

    with pytest.raises((WorkerError, ValueError), match="takes no group="):
        _run(cluster4, {"grad_sync": planted.LessonTwoSignature}, steps=1)


# one planted wrong piece per check by default; all of them with SIMLIB_FULL_GRADE=1 (each runs lesson 02's checks)
_FULL = os.environ.get("SIMLIB_FULL_GRADE") == "1"
_PLANTED = [
    ("gpt_grad_sync", planted.GivesUnusedAGradient, "leave it none"),
    ("gpt_tp_attention", planted.ContiguousRows, "(3, heads, head_dim)"),
] + (
    [
        ("gpt_grad_sync", planted.WaitsOnNoneHandle, "without an exception"),
        ("gpt_grad_sync", planted.IgnoresTheGroup, "get_world_size(self.group)"),
        ("gpt_grad_sync", planted.SendsEveryBucketTwice, "one all_reduce per bucket per step"),
        ("gpt_tp_attention", planted.NoGradientAllReduce, "megatron's f"),
        ("gpt_tp_attention", planted.BiasOnEveryRank, "add it once"),
        ("gpt_tp_attention", planted.FloorsTheHeads, "names the number of heads"),
    ]
    if _FULL
    else []
)


@pytest.mark.parametrize("exercise,bug,hint", _PLANTED, ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_planted_piece_is_caught_with_a_hint_that_names_it(exercise, bug, hint, clusters):
    report = grading.check(exercise, bug, clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed
    words = " ".join(f"{r.name} {r.hint}" for r in report.failed()).lower()
    assert hint.lower() in words, "\n".join(r.line() for r in report.results)
