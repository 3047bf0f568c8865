"""Lessons 04-05 graders: solutions pass, stubs report "not implemented yet", every planted bug is caught.

(The generic checks over every solution notebook live in tests/test_grading.py; here: the planted bugs.)
"""

from pathlib import Path

import cloudpickle
import pytest
from planted import one_f_one_b as planted_1f1b  # noqa: E402
from planted import pipeline_stage as planted_stage
from planted import tp_linear as planted_tp

from simlib import grading
from simlib.exercises import load_answers

ROOT = Path(__file__).resolve().parent.parent
for module in (planted_1f1b, planted_stage, planted_tp):
    cloudpickle.register_pickle_by_value(module)

NOTEBOOKS = {
    "one_f_one_b": ("04_one_f_one_b", "one_f_one_b_order"),
    "pipeline_stage": ("04_pipeline_stage", "pipeline_stage_step"),
    "tp_linear": ("05_tp_linear", "tp_linear"),
}
PLANTED = {
    "one_f_one_b": {f.__name__: f for f in planted_1f1b.PLANTED},
    "pipeline_stage": {f.__name__: f for f in planted_stage.PLANTED},
    "tp_linear": planted_tp.PLANTED,
}
# the hint a learner sees for each planted bug must point at the bug
HINTS = {
    "gpipe_order": "GPipe",
    "warmup_off_by_one": "p - r - 1",
    "warmup_from_the_wrong_end": "p - r - 1",
    "cooldown_newest_first": "oldest first",
    "forgets_the_last_backward": "one ('backward', i) per micro-batch",
    "loss_not_divided_by_m": "divide each micro-batch's loss",
    "sends_the_received_gradient": "x.grad",
    "backward_from_a_sum": "gradient it received",
    "column_backward_without_all_reduce": "Megatron's f",
    "row_forward_without_all_reduce": "Megatron's g",
    "row_bias_before_all_reduce": "once, after the all-reduce",
    "weight_gradient_all_reduced": "no all-reduce",
}


def test_planted_bugs_are_listed():
    assert all(len(bugs) >= 3 for bugs in PLANTED.values())
    assert set(HINTS) == {name for bugs in PLANTED.values() for name in bugs}
    assert set(PLANTED) <= set(grading.EXERCISES)


@pytest.mark.parametrize("exercise", sorted(NOTEBOOKS))
def test_solution_passes_and_stub_is_not_implemented(exercise, clusters):
    notebook, answer = NOTEBOOKS[exercise]
    report = grading.check(
        exercise, load_answers(ROOT / "solutions" / f"{notebook}.ipynb")[answer], clusters=clusters, quiet=True
    )
    assert report.passed, "\n".join(r.line() for r in report.results)
    stub = grading.check(
        exercise, load_answers(ROOT / "exercises" / f"{notebook}.ipynb")[answer], clusters=clusters, quiet=True
    )
    assert stub.status == "not implemented"


@pytest.mark.parametrize("exercise,bug", [(e, b) for e, bugs in PLANTED.items() for b in bugs])
def test_planted_bug_is_caught(exercise, bug, clusters):
    report = grading.check(exercise, PLANTED[exercise][bug], clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed and report.status in ("fail", "error"), report
    hints = " ".join(r.hint for r in report.failed())
    assert HINTS[bug] in hints, "\n".join(r.line() for r in report.results)


def test_the_flows_on_the_wire_are_judged_pair_by_pair():
    """wire.flow_breach (the pipeline stage's and ring attention's reading of the kernel's counters): the small
    messages of a run between other pairs pass; data to a rank the algorithm never sends to, or too little to a
    neighbour, is named."""
    from simlib.grading.wire import flow_breach

    need = {(0, 1): 400, (1, 0): 400, (1, 2): 400, (2, 1): 400}
    seen = {(0, 1): [432, 6], (1, 0): [432, 6], (1, 2): [432, 6], (2, 1): [432, 6], (0, 2): [192, 4]}
    assert flow_breach(seen, need, "activations") == ""
    assert "to rank 2 on the wire" in flow_breach({**seen, (0, 2): [9000, 3]}, need, "activations")
    assert "alone are 400" in flow_breach({**seen, (1, 2): [100, 1]}, need, "activations")
