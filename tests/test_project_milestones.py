"""Issue 47, item 4: the milestones verify the recorded run's length on the grader's own workers. Two wrong answers
that passed every check before (the record and the weights are tied only by a last evaluation the learner writes):

- weights from a run longer than the budget, passed beside the record of the standard (shorter) run, its last
  evaluation edited to what the longer run's weights score;
- BatchNorm statistics recomputed on the held-out digits after training, the last evaluation edited to match
  (vision).

Both fail now, at the whole recorded run re-run there, with the hint that names them."""

import dataclasses

import pytest
import torch

from simlib import grading
from simlib.projects.runner import load_state, project_settings, run_project

HINT = "not the end of the run the record describes"


def _with_last_eval(record, metrics: dict):
    """The record as a learner edits it: its last evaluation says ``metrics``, everything else as it was."""
    last = dict(record.evals[-1], eval={**record.evals[-1]["eval"], **metrics})
    return dataclasses.replace(record, evals=record.evals[:-1] + [last])


def _caught(exercise, answer, cluster2):
    report = grading.check(exercise, answer, clusters={2: cluster2}, quiet=True)
    assert not report.passed, "\n".join(r.line() for r in report.results)
    failed = report.failed()
    assert HINT in " ".join(r.hint for r in failed), "\n".join(r.line() for r in report.results)
    assert all(r.passed for r in report.results if r not in failed)  # every other check was passed: only this one


@pytest.fixture(scope="module")
def vision(vision_quick_run):
    """The vision project's standard quick run on 2 ranks: (task, record, state), as a learner passes it (one run
    for the session: tests/conftest.py)."""
    return vision_quick_run


def test_weights_of_a_longer_run_beside_a_shorter_runs_record_fail(vision, cluster2):
    task, record, _ = vision
    steps = project_settings("vision", "quick")["steps"]
    _, longer = run_project("vision", 2, quick=True, cluster=cluster2, verbose=False, steps=steps + steps // 2)
    model = load_state(task, longer).eval()
    with torch.no_grad():
        scored = task.evaluate(model)
    _caught("vision_milestone", (task, _with_last_eval(record, scored), longer), cluster2)


def test_batchnorm_statistics_recomputed_on_the_held_out_digits_fail(vision, cluster2):
    from simlib.grading.vision_finance import vision_heldout

    task, record, state = vision
    model = load_state(task, state)
    x, y = vision_heldout(task.image_size)
    for m in model.modules():  # the statistics of the held-out digits themselves: a cumulative average over them
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    forged = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _caught("vision_milestone", (task, _with_last_eval(record, {"accuracy": accuracy}), forged), cluster2)
