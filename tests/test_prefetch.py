"""ZeRO-3 prefetching (simlib.parallel.zero_prefetch): the solution passes the check, planted wrong versions fail."""

from pathlib import Path

from planted.prefetch import (
    BackwardWrongWay,
    ClaimsItsCounts,
    GathersEverythingUpFront,
    NoPrefetch,
    SkipsABlock,
    WrongShard,
)

from simlib import grading
from simlib.exercises import load_answers
from simlib.parallel.zero_prefetch import Zero3Prefetch

ROOT = Path(__file__).resolve().parents[1]


def test_solution_passes_and_planted_versions_fail(cluster2, cluster3):
    clusters = {2: cluster2, 3: cluster3}
    solution = load_answers(ROOT / "solutions" / "09b_zero3_prefetch.ipynb")["MyPrefetch"]
    assert grading.check("zero3_prefetch", solution, clusters=clusters, quiet=True, timeout=300).passed
    # the course's own Zero3Prefetch is the reference: handing it in (or hooks that call super()) is refused
    report = grading.check("zero3_prefetch", Zero3Prefetch, clusters=clusters, quiet=True, timeout=300)
    assert not report.passed and "the course's own on_forward" in report.failed()[0].detail, report
    for planted, failing in (
        (NoPrefetch, "prefetched"),
        (BackwardWrongWay, "prefetched"),
        (SkipsABlock, "prefetched"),
        (WrongShard, "same losses"),
        (GathersEverythingUpFront, "at most one block"),
        (ClaimsItsCounts, "prefetched"),
    ):
        report = grading.check(
            "zero3_prefetch", planted, clusters=clusters, quiet=True, timeout=300, first_failure=True
        )
        assert not report.passed, planted.__name__
        assert any(failing in r.name for r in report.failed()), (planted.__name__, report)
