"""The grader: solutions pass every check, stubs say "not implemented yet", every planted bug is caught.

Planted wrong implementations live in tests/planted/ (one module per exercise).
"""

from pathlib import Path

import cloudpickle
import pytest
from planted import accumulate as planted_accumulate  # noqa: E402
from planted import average as planted_average
from planted import bucket as planted_bucket
from planted import ring as planted_ring

from simlib import grading
from simlib.exercises import exercises_of, load_answers

ROOT = Path(__file__).resolve().parent.parent
for module in (planted_ring, planted_average, planted_bucket, planted_accumulate):
    cloudpickle.register_pickle_by_value(module)  # send them as a notebook cell's code would travel

SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9]*.ipynb"))
PLANTED = {
    "ring_all_reduce": planted_ring.PLANTED,
    "average_gradients": planted_average.PLANTED,
    "bucket_data_parallel": planted_bucket.PLANTED,
    "accumulate_no_sync": planted_accumulate.PLANTED,
}
# the hint a learner sees for each planted bug must point at the bug
HINTS = {
    "mean_instead_of_sum": "do not divide",
    "off_by_one_chunk": "all-gather",
    "drops_the_remainder": "last",
    "reduce_scatter_only": "all-gather",
    "calls_all_reduce": "point-to-point",
    "returns_a_copy": "in place",
    "sum_instead_of_mean": "divide by world_size",
    "weights_only": "only some parameters",
    "reduces_a_copy": "did not change",
    "max_instead_of_sum": "all_reduce(p.grad)",
    "PerParameterBlocking": "on its own",
    "AllReduceAfterBackward": "after backward had finished",
    "NoDivide": "divide by world_size",
    "NoReset": "reset",
    "loss_not_divided_by_k": "too large",
    "no_sync_left_on_at_last_step": "outside no_sync",
    "never_no_sync": "every micro-batch",
    "step_every_micro_batch": "one optimizer.step()",
    "forgets_zero_grad": "zero_grad()",
    # issue 8: aliases of collectives, world size 3, what breaks the workers, two classic slips
    "calls_all_reduce_by_another_name": "under any name",
    "calls_the_process_group": "under any name",
    "bitmask_instead_of_modulo": "disagree on the message size",
    "divides_twice": "divided by world_size twice",
    "reduce_to_rank_zero": "right on rank 0 only",
    "power_of_two_world_size": "exactly dist.get_world_size()",
    "DividesTwice": "divided by world_size twice",
    "PowerOfTwoWorldSize": "exactly dist.get_world_size()",
    "hard_coded_k": "do not hard-code",
    # issue 33: right gradients, wrong algorithm (k times the activation memory)
    "one_big_batch": "torch.cat of the micro-batches",
    "sums_losses_one_backward": "one backward of the summed",
    # issue 47: honest mistakes the fixed instances never exercised, and measures the answer could reach
    "no_none_guard": "",
    "sends_around_the_recorder": "below every python name",
    "tabulates": "",
    "WaitsAtOnce": "stalls backward",
    "DecoyAsync": "all-reduce",  # the decoy is one all-reduce too many per bucket, or the stall shows
    "CountedBelowTheName": "one all-reduce per bucket",
    "flat_buffer_in_float32": "rounded to float32",
}


def _entries(path):
    import nbformat

    return exercises_of(nbformat.read(str(path), as_version=4))


def test_every_exercise_has_a_solution_and_planted_bugs():
    graded = {e["exercise"] for path in SOLUTIONS for e in _entries(path)}  # lessons 04+ add theirs
    assert set(PLANTED) <= graded <= set(grading.EXERCISES)
    assert all(len(bugs) >= 3 for bugs in PLANTED.values())
    assert set(HINTS) == {b.__name__ for bugs in PLANTED.values() for b in bugs}


class _Recording(dict):
    """The clusters, noting which world sizes a check asked for."""

    def __init__(self, clusters):
        super().__init__(clusters)
        self.asked = set()

    def get(self, world_size, default=None):
        self.asked.add(world_size)
        return super().get(world_size, default)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_passes_every_check(path, clusters):
    answers = load_answers(path)
    for entry in _entries(path):
        recording = _Recording(clusters)
        report = grading.check(entry["exercise"], answers[entry["answer"]], clusters=recording, quiet=True)
        assert report.passed, "\n".join(r.line() for r in report.results)
        assert len(report.results) >= 4
        # issue 19: every multi-rank check runs on 2, 3 and 4 ranks (3 catches even-split and power-of-two code)
        if recording.asked - {1}:
            assert {2, 3, 4} <= recording.asked, (entry["exercise"], sorted(recording.asked))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_untouched_exercise_reports_not_implemented(path, clusters, capsys):
    answers = load_answers(ROOT / "exercises" / path.name)
    for entry in _entries(path):
        report = grading.check(entry["exercise"], answers[entry["answer"]], clusters=clusters)
        assert report.status == "not implemented" and not report.passed
        out = capsys.readouterr().out
        assert "not implemented yet" in out and "Traceback" not in out


@pytest.mark.parametrize(
    "exercise,bug",
    [(e, b) for e, bugs in PLANTED.items() for b in bugs],
    ids=lambda x: x if isinstance(x, str) else x.__name__,
)
def test_planted_bug_is_caught(exercise, bug, clusters):
    report = grading.check(exercise, bug, clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed and report.status in ("fail", "error")
    hints = " ".join(r.hint for r in report.failed()).lower()
    assert HINTS[bug.__name__].lower() in hints, "\n".join(r.line() for r in report.results)


def test_exception_in_learner_code_is_reported(clusters, capsys):
    report = grading.check("average_gradients", planted_average.raises, clusters=clusters)
    assert report.status == "error"
    out = capsys.readouterr().out
    # every rank raises; whichever rank's report arrives first is named
    assert "ValueError" in out and "oops" in out and ("rank 0" in out or "rank 1" in out)


def test_hang_is_reported_and_the_workers_recover(cluster2):
    # a deadlock never answers: a 2-s base limit (scaled by the load, then retried once at twice that) provokes
    # the same report as a longer one, in half the time (4 s took 22-26 s here)
    report = grading.check("ring_all_reduce", planted_ring.deadlock, clusters={2: cluster2}, timeout=2, quiet=True)
    assert report.status == "timeout"
    assert "matching recv" in report.results[-1].hint
    assert cluster2.run(lambda: 1) == [1, 1]  # restarted, usable again


def test_unknown_exercise_is_reported_not_raised(capsys):
    report = grading.check("no_such_exercise", print)
    assert report.status == "error" and "known exercises" in capsys.readouterr().out


def test_result_lines():
    ok = grading.Result("sums", True, detail="max error 0")
    bad = grading.Result("sums", False, hint="divide", detail="max error 1")
    assert ok.line().startswith("✔") and "hint" not in ok.line()
    assert bad.line().startswith("✘") and "hint: divide" in bad.line()


def test_ring_hints_fit_the_case_and_are_not_repeated(clusters, capsys):
    """Fewer elements than ranks is its own case (not "the last N elements are wrong"), and a hint already shown
    is not printed again for the next case."""
    report = grading.check("ring_all_reduce", planted_ring.off_by_one_chunk, clusters=clusters)
    out = capsys.readouterr().out
    tiny = [r for r in report.results if "numel < world_size" in r.name and not r.passed]  # drawn shapes
    assert tiny and all("the last" not in r.hint for r in tiny)
    assert "same as above" in out
    hints = [line for line in out.splitlines() if "hint:" in line and "same as above" not in line]
    assert len(hints) == len(set(hints))


def test_hang_reports_the_time_it_took():
    """A deadlock caught by the collectives' own timeout (3 s here) says so, not "no answer within 30 s"."""
    import time

    import simlib

    with simlib.Cluster(2, timeout=3, threads=1) as quick_timeout:
        t0 = time.monotonic()
        report = grading.check(
            "ring_all_reduce", planted_ring.deadlock, clusters={2: quick_timeout}, timeout=30, quiet=True
        )
        elapsed = time.monotonic() - t0
    detail = report.results[-1].detail
    said = int(detail.split("stopped after ")[1].split(" s")[0])
    assert said <= elapsed + 1 and "waited longer than" in detail  # the collective's timeout fired first


@pytest.mark.parametrize(
    "bug", [planted_ring.destroys_process_group, planted_ring.kills_its_worker], ids=lambda b: b.__name__
)
def test_check_after_broken_workers_starts_healthy(bug, clusters):
    """Issue 8, item 10: a learner's code that breaks its worker is named (rank 1), and the next check of a
    correct solution passes on the same clusters."""
    report = grading.check("ring_all_reduce", bug, clusters=clusters, quiet=True)
    hint = report.failed()[0].hint
    assert report.status == "error", "\n".join(r.line() for r in report.results)
    assert (
        "destroy_process_group() on rank 1" in hint
        if bug is planted_ring.destroys_process_group
        else "rank 1's worker process ended" in hint and "os._exit()" in hint
    ), hint
    solution = load_answers(ROOT / "solutions" / "01_ring_all_reduce.ipynb")["ring_all_reduce"]
    good = grading.check("ring_all_reduce", solution, clusters=clusters, quiet=True)
    assert good.passed, "\n".join(r.line() for r in good.results)


def test_first_failure_makes_no_run_after_a_failed_check(monkeypatch):
    """check(first_failure=True), used by the planted-answer tests: the runs made keep all their results, no run
    follows a failed check; without it (what a learner sees) every check runs."""
    from simlib.grading import core

    class FakeCluster:
        calls = 0

        def call(self, fn, *args, **kwargs):
            FakeCluster.calls += fn is not core._probe
            return [None, None]

    def three_runs(answer, grader):
        for n in (2, 3, 4):
            grader.run(n, print)
            yield core.Result(f"{n} ranks: first", True)
            yield core.Result(f"{n} ranks: second", n != 2, hint="caught at 2")

    monkeypatch.setitem(core.EXERCISES, "fake_three_runs", three_runs)
    fake = {n: FakeCluster() for n in (2, 3, 4)}
    report = grading.check("fake_three_runs", len, clusters=fake, quiet=True, first_failure=True)  # None: unanswered
    assert FakeCluster.calls == 1 and [r.name for r in report.results] == ["2 ranks: first", "2 ranks: second"]
    assert report.status == "fail" and report.failed()[0].hint == "caught at 2"
    FakeCluster.calls = 0
    report = grading.check("fake_three_runs", len, clusters=fake, quiet=True)
    assert FakeCluster.calls == 3 and len(report.results) == 6


def test_strict_mode_fails_a_solution_that_does_not_pass_everywhere(monkeypatch):
    """SIMLIB_GRADE_STRICT=1 (the suite sets it for the kernels running solutions/, and leaves
    test_solution_passes_every_check out for them): a failed check, fewer than four checks, or a multi-rank run
    not on 2, 3 and 4 ranks raises, so the notebook's run fails; unset, check() only reports."""
    from simlib.grading import core

    class FakeCluster:
        def call(self, fn, *args, **kwargs):
            return [None]

    def exercise(sizes, good):
        def run(answer, grader):
            for n in sizes:
                grader.run(n, print)
                yield from (core.Result(f"{n} ranks: {i}", good) for i in range(2))

        return run

    fake = {n: FakeCluster() for n in (2, 3, 4)}
    monkeypatch.setenv(core.STRICT, "1")
    for sizes, good, says in (
        ((2, 3, 4), False, "does not pass"),
        ((2, 3), True, "not 2, 3 and 4"),
        ((2,), True, "only 2 checks"),
    ):
        monkeypatch.setitem(core.EXERCISES, "fake", exercise(sizes, good))
        with pytest.raises(AssertionError, match=says):
            grading.check("fake", len, clusters=fake, quiet=True)  # any answer (None is an unanswered exercise)
    monkeypatch.setitem(core.EXERCISES, "fake", exercise((2, 3, 4), True))
    assert grading.check("fake", len, clusters=fake, quiet=True).passed
    monkeypatch.delenv(core.STRICT)
    monkeypatch.setitem(core.EXERCISES, "fake", exercise((2, 3, 4), False))
    assert not grading.check("fake", len, clusters=fake, quiet=True).passed


def test_switched_off_library_functions_refuse_under_every_alias():
    """grading.contracts.switched_off: the course's own reference (e.g. schedules.one_f_one_b) raises
    UsedTheLibrary naming it while the answer runs, through a name bound before, and works again after."""
    from simlib.grading.contracts import UsedTheLibrary, switched_off
    from simlib.parallel import schedules
    from simlib.parallel.schedules import one_f_one_b as bound_before

    want = schedules.one_f_one_b(2, 2)
    with switched_off(schedules.one_f_one_b):
        for call in (schedules.one_f_one_b, bound_before):
            with pytest.raises(UsedTheLibrary, match="course's own one_f_one_b"):
                call(2, 2)
    assert schedules.one_f_one_b(2, 2) == want
