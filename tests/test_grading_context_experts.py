"""Lesson 09 graders: every planted bug is caught with a hint that names it (on 2, 3 and 4 ranks).

(tests/test_grading.py runs every solution and every untouched exercise, these two included.)"""

import cloudpickle
import pytest
from planted import context_experts as planted  # noqa: E402

from simlib import grading

cloudpickle.register_pickle_by_value(planted)

PLANTED = {"ring_attention": planted.RING, "moe_dispatch": planted.MOE}
HINTS = {
    "softmax_not_renormalised": "without renormalising",
    "causal_mask_on_every_block": "applied to every block",
    "diagonal_block_unmasked": "the diagonal one",
    "wrong_source_block": "(rank − step) mod n",
    "tokens_to_the_wrong_rank": "wrong rank",
    "capacity_ignored": "capacity was ignored",
    "gate_not_applied": "by its token's gate",
}


def test_planted_bugs_are_listed():
    assert all(len(bugs) >= 3 for bugs in PLANTED.values())
    assert set(HINTS) == {name for bugs in PLANTED.values() for name in bugs}


@pytest.mark.parametrize("exercise,bug", [(e, b) for e, bugs in PLANTED.items() for b in bugs])
def test_planted_bug_is_caught(exercise, bug, clusters):
    report = grading.check(exercise, PLANTED[exercise][bug], clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed and report.status in ("fail", "error"), report
    hints = " ".join(r.hint for r in report.failed())
    assert HINTS[bug] in hints, "\n".join(r.line() for r in report.results)


def test_tokens_sent_over_capacity_are_seen_on_the_wire(clusters):
    """The right output and the right collectives on record: only the kernel's byte counters (read by the grader,
    outside the answer's process) see the tokens over capacity cross to their expert's rank and back."""
    from simlib.grading import wire

    if not wire.available():
        pytest.skip("the kernel's TCP counters cannot be read here (no ss)")
    answer = planted.tokens_over_capacity_sent_anyway
    report = grading.check("moe_dispatch", answer, clusters=clusters, quiet=True, first_failure=True)
    failed = report.failed()
    assert [r.name for r in failed] == [r.name for r in report.results if "on the wire" in r.name], report.results
    assert len(failed) == 1 and "BEFORE the dispatch" in failed[0].hint, failed


def test_bytes_beyond_the_course_run_are_judged_rank_by_rank():
    """wire.beyond: the payload plus four times the framing the course's run put on the wire is allowed (a right
    answer framing its messages otherwise); twice the payload is not, on the rank that sent it."""
    from simlib.grading.wire import beyond

    payload, reference = [10_000, 0], [10_500, 800]  # rank 1 sends no payload, only framing
    assert beyond(reference, reference, payload, "rows") == ""
    assert beyond([12_000, 3_200], reference, payload, "rows") == ""  # up to 4x the framing
    assert "rank 0 sent 20,000 bytes" in beyond([20_000, 800], reference, payload, "rows")
    assert "rank 1 sent 3,300 bytes" in beyond([10_500, 3_300], reference, payload, "rows")
    assert "the ranks together" in beyond([30_000], [11_300], [10_000], "parameters")
