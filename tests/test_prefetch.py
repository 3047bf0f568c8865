"""ZeRO-3 prefetching (simlib.parallel.zero_prefetch): the solution passes the check, planted wrong versions fail."""
from planted.prefetch import (BackwardWrongWay, ClaimsItsCounts, GathersEverythingUpFront, NoPrefetch, SkipsABlock,
                              WrongShard)

from simlib import grading
from simlib.parallel.zero_prefetch import Zero3Prefetch


def test_solution_passes_and_planted_versions_fail(cluster2, cluster3):
    clusters = {2: cluster2, 3: cluster3}
    assert grading.check("zero3_prefetch", Zero3Prefetch, clusters=clusters, quiet=True, timeout=300).passed
    for planted, failing in ((NoPrefetch, "prefetched"), (BackwardWrongWay, "prefetched"),
                             (SkipsABlock, "prefetched"), (WrongShard, "same losses"),
                             (GathersEverythingUpFront, "at most one block"), (ClaimsItsCounts, "prefetched")):
        report = grading.check("zero3_prefetch", planted, clusters=clusters, quiet=True, timeout=300,
                               first_failure=True)
        assert not report.passed, planted.__name__
        assert any(failing in r.name for r in report.failed()), (planted.__name__, report)
