"""Issue 33's family 3, second round (the holes the second red team found, benchmarks/redteam2/README.md): right
outputs by another algorithm, caught by the exercise's contract - what the ring's messages carry, how much an
average moves, the order a GPipe stage's messages run in, which K/V blocks ring attention holds at once, whose code
a full state runs. Each planted answer (tests/planted/family3.py) must fail with the check that names its
contract and only after every value check passed; the solutions still pass (tests/test_grading.py and the
solutions' strict nbval runs)."""

import cloudpickle
import pytest
from planted import family3  # noqa: E402

from simlib import grading

cloudpickle.register_pickle_by_value(family3)

CONTRACT = {
    "ring_on_zeros_sum_through_files": "the messages carry the ring's partial sums",
    "all_gather_then_mean": "moves no more than one all-reduce of the gradients",
    "backward_right_after_forward": "GPipe's schedule",
    "ring_keeps_every_block_then_sdpa": "at most two other ranks' K/V blocks held at once",
    "ring_keeps_every_block_in_numpy": "at most two other ranks' K/V blocks held at once",
}
HINT = {
    "ring_on_zeros_sum_through_files": "a ring on zeros",
    "all_gather_then_mean": "(n-1)x the gradients",
    "backward_right_after_forward": "no pipelining",
    "ring_keeps_every_block_then_sdpa": "no rank ever holds the whole K/V",
    "ring_keeps_every_block_in_numpy": "no NumPy copies",
}
CASES = [(exercise, answer) for exercise, answers in family3.FAMILY3_CONTRACTS.items() for answer in answers]


@pytest.mark.parametrize("exercise,answer", CASES, ids=[a.__name__ for _, a in CASES])
def test_the_contract_catches_right_numbers_by_another_algorithm(exercise, answer, clusters):
    report = grading.check(exercise, answer, clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed, report
    failed = report.failed()
    assert len(failed) == 1 and CONTRACT[answer.__name__] in failed[0].name, "\n".join(r.line() for r in report.results)
    assert HINT[answer.__name__] in failed[0].hint, failed[0].line()
    assert all(r.passed for r in report.results if r is not failed[0]), "\n".join(r.line() for r in report.results)


def test_a_copy_of_the_librarys_code_is_noted_for_the_teacher_not_failed():
    """Issue 47: a copy of the library's code is not refused (the library is open); `simlib grade` adds a note row
    when a submission's function is structurally close to the library's own (renamed, re-commented, a no-op line
    added: the old bytecode check missed that), and none for the course's own solution written from scratch."""
    import inspect

    import nbformat

    from simlib import collectives
    from simlib.grading.notebook_run import note_rows
    from simlib.grading.similarity import similarity

    source = inspect.getsource(collectives.ring_all_reduce)
    disguised = source.replace("tensor", "my_tensor").rstrip() + "\n    pass  # a no-op line\n"
    assert similarity(source, disguised) > 0.95
    typed_in = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch\n\n" + disguised)])
    notes = note_rows("alice.ipynb", "ring_all_reduce", typed_in)
    assert len(notes) == 1 and notes[0].kind == "note" and notes[0].passed, notes
    assert "ring_all_reduce" in notes[0].check and "note for the teacher" in notes[0].hint
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    own = nbformat.read(str(root / "solutions" / "01_ring_all_reduce.ipynb"), as_version=4)
    assert note_rows("bob.ipynb", "ring_all_reduce", own) == []
