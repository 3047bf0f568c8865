"""Lesson 13's grader: the solution passes, every planted mistake fails with a hint that names it, and the plans
are drawn at check time (a fixed table of answers cannot pass). In-process, no workers: a few seconds."""

import json
from pathlib import Path

import pytest
from planted import planner as planted  # noqa: E402

from simlib import grading
from simlib.grading import planner as checks

HINTS = {
    "zero1_shards_everything": "stage 3 shards them",
    "activations_not_split_by_tp": "(34 + 5*a*s/h)/tp",
    "gpipe_like_1f1b": "GPipe: all m",
    "forgets_the_logits": "logits add",
    "forgets_the_recompute_working_set": "adds one layer's whole set",
    "floor_division_in_attention": "(34 + 5*a*s/h)/tp",
    "vocabulary_padded_to_128": "not padded to",
    "layers_floor_divided": "you used L // pp",  # issue 48 item 6: the hint names the term, with this plan's numbers
}


def _solution():
    nb = json.loads((Path(__file__).parents[1] / "solutions" / "13_plan_memory.ipynb").read_text())
    code = "".join(next(c["source"] for c in nb["cells"] if "def plan_memory" in "".join(c["source"])))
    scope = {}
    exec(code, scope)
    return scope["plan_memory"]


def test_solution_passes():
    report = grading.check("plan_memory", _solution(), quiet=True)
    assert report.passed, [r.line() for r in report.results]


@pytest.mark.parametrize("bug", planted.PLANTED, ids=lambda f: f.__name__)
def test_planted_fails_with_its_hint(bug):
    report = grading.check("plan_memory", bug, quiet=True)
    assert not report.passed, bug.__name__
    failed = [r for r in report.results if not r.passed]
    assert any(HINTS[bug.__name__] in r.hint for r in failed), [r.line() + " | " + r.hint for r in failed]


def test_a_table_of_answers_does_not_pass():
    """Memorising a seeded draw fails: every plan comes from the OS's randomness at check time."""
    table = {(m.name, s): checks.reference(m, s) for m, s in checks.draw_cases(13, 30)}  # a seeded draw

    def lookup(model, s):
        return table.get((model.name, s)) or dict.fromkeys(checks.PARTS, 0.0)

    assert not grading.check("plan_memory", lookup, quiet=True).passed


def test_not_implemented_is_todo():
    def stub(model, s):
        raise NotImplementedError()

    report = grading.check("plan_memory", stub, quiet=True)
    assert not report.passed and report.results[0].status == grading.TODO


def test_a_plan_that_cannot_tell_two_slips_apart_names_both():
    """L = 8 on pp = 3 with m = 4 under GPipe: L // pp (2 layers x 4 in flight) and min(pp, m) in flight (8/3 x 3)
    give the same bytes; the hint names both (the burner run's flaky planted test: it named only the first)."""
    from simlib.sim import Strategy, gpt

    model = gpt(8, 768, 8, seq_len=512, vocab=50304)
    s = Strategy(dp=8, tp=1, pp=3, micro_batch=4, num_micro_batches=4, zero_stage=3, schedule="gpipe")
    got = checks._activations(model, s, in_flight=3)
    assert checks._near(got, checks._activations(model, s, layers=2))
    hint = checks.diagnose("activations", got, model, s)
    assert "cannot tell them apart" in hint and "GPipe: all m" in hint and "L // pp" in hint, hint
