"""Lesson 05b's grader (online-softmax attention): a right answer passes, every planted mistake is caught with a
hint that names it, and each check draws its instances afresh. One one-process worker, shared."""

import cloudpickle
import pytest
from planted import one_device as planted  # noqa: E402

from simlib import grading
from simlib.grading import one_device

cloudpickle.register_pickle_by_value(planted)

HINTS = {
    "missing_running_max": "subtract the running max",
    "wrong_rescale": "right with one block, wrong with several",
    "materialises_full_matrix": "never T x T",
    "causal_off_by_one": "causal off by one",
    "max_from_first_block": "the max must be a running max",
    "accumulates_in_input_dtype": "round to bfloat16 once",
}


def right(q, k, v, causal, block):
    return planted._blocks(q, k, v, causal, block, planted._right_merge)


def test_every_planted_mistake_is_listed_with_its_hint():
    assert set(HINTS) == set(planted.PLANTED) and len(planted.PLANTED) >= 3


def test_instances_are_drawn_afresh_with_blocks_that_do_not_divide():
    a, b = one_device._instances(1), one_device._instances(2)
    assert a != b
    for cases in (a, b):
        assert {c["causal"] for c in cases} == {True, False} and {c["dtype"] for c in cases} == {"float32", "bfloat16"}
        assert any(c["t"] % c["block"] for c in cases) and any(c["large"] for c in cases)


def test_a_right_answer_passes_and_each_planted_mistake_is_caught(monkeypatch):
    report = grading.check("online_softmax", right, quiet=True)
    assert report.passed, "\n".join(r.line() for r in report.results)
    search = one_device._attention_smallest
    for name, bug in planted.PLANTED.items():
        # the smallest failing instance is searched for the first mistake only (each search is up to 6 runs)
        searched = name == "wrong_rescale"
        monkeypatch.setattr(one_device, "_attention_smallest", search if searched else lambda *a: "")
        report = grading.check("online_softmax", bug, quiet=True)
        assert not report.passed, name
        hints = " ".join(r.hint for r in report.failed())
        assert HINTS[name] in hints, (name, "\n".join(r.line() for r in report.results))
        if searched:  # its values differ: the hint names the smallest instance where, shrunk from the drawn one
            assert "Smallest failing instance found" in hints and "T=" in hints, (name, hints)


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    yield
    grading.close()
