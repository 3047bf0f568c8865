"""Lesson 08's exercise (full_state): each planted state that leaves one part out is caught, with a hint naming it.

(The solution and the untouched exercise are checked by tests/test_grading.py, which runs every solution.)
"""
import cloudpickle
import pytest

from simlib import grading

from planted import full_state as planted  # noqa: E402

cloudpickle.register_pickle_by_value(planted)


@pytest.mark.parametrize("bug", planted.PLANTED, ids=lambda b: b.__name__)
def test_planted_state_is_caught_with_its_hint(bug, cluster2, cluster3, cluster4):
    report = grading.check("full_state", bug, clusters={2: cluster2, 3: cluster3, 4: cluster4}, quiet=True, timeout=120)
    assert not report.passed and report.status == planted.STATUS.get(bug.__name__, "fail"), report
    hints = " ".join(r.hint + " " + r.detail for r in report.failed()).lower()
    assert planted.HINTS[bug.__name__] in hints, "\n".join(r.line() for r in report.results)
