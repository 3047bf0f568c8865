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
    "LibraryCodeCopied": "run code of your own",
}
HINT = {
    "ring_on_zeros_sum_through_files": "a ring on zeros",
    "all_gather_then_mean": "(n-1)x the gradients",
    "backward_right_after_forward": "no pipelining",
    "ring_keeps_every_block_then_sdpa": "no rank ever holds the whole K/V",
    "ring_keeps_every_block_in_numpy": "no NumPy copies",
    "LibraryCodeCopied": "a copy of their code",
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
