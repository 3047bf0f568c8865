"""Lesson 09 graders: solutions pass, stubs report "not implemented yet", every planted bug is caught with a hint
that names it (on 2, 3 and 4 ranks)."""
from pathlib import Path

import cloudpickle
import pytest

from simlib import grading
from simlib.exercises import load_answers

from planted import context_experts as planted  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
cloudpickle.register_pickle_by_value(planted)

NOTEBOOKS = {"ring_attention": ("09_ring_attention", "ring_attention"),
             "moe_dispatch": ("09_moe_dispatch", "moe_forward")}
PLANTED = {"ring_attention": planted.RING, "moe_dispatch": planted.MOE}
HINTS = {"softmax_not_renormalised": "without renormalising", "causal_mask_on_every_block": "applied to every block",
         "diagonal_block_unmasked": "the diagonal one", "wrong_source_block": "(rank − step) mod n",
         "tokens_to_the_wrong_rank": "wrong rank", "capacity_ignored": "capacity was ignored",
         "gate_not_applied": "by its token's gate"}


@pytest.fixture(scope="module")
def clusters(cluster2, cluster3, cluster4):
    return {2: cluster2, 3: cluster3, 4: cluster4}


def test_planted_bugs_are_listed():
    assert all(len(bugs) >= 3 for bugs in PLANTED.values())
    assert set(HINTS) == {name for bugs in PLANTED.values() for name in bugs}


@pytest.mark.parametrize("exercise", sorted(NOTEBOOKS))
def test_solution_passes_and_stub_is_not_implemented(exercise, clusters):
    notebook, answer = NOTEBOOKS[exercise]
    report = grading.check(exercise, load_answers(ROOT / "solutions" / f"{notebook}.ipynb")[answer],
                           clusters=clusters, quiet=True)
    assert report.passed, "\n".join(r.line() for r in report.results)
    assert len(report.results) == 6  # 2, 3 and 4 ranks, two cases each
    stub = grading.check(exercise, load_answers(ROOT / "exercises" / f"{notebook}.ipynb")[answer],
                         clusters=clusters, quiet=True)
    assert stub.status == "not implemented"


@pytest.mark.parametrize("exercise,bug", [(e, b) for e, bugs in PLANTED.items() for b in bugs])
def test_planted_bug_is_caught(exercise, bug, clusters):
    report = grading.check(exercise, PLANTED[exercise][bug], clusters=clusters, quiet=True)
    assert not report.passed and report.status in ("fail", "error"), report
    hints = " ".join(r.hint for r in report.failed())
    assert HINTS[bug] in hints, "\n".join(r.line() for r in report.results)
