"""Issue 33's families of holes, closed by design: a planted wrong answer per family (tests/planted/families.py)
that the old checks passed must now fail, with the check that names the family; the solutions still pass
(tests/test_grading.py)."""

import cloudpickle
import pytest
from planted import families  # noqa: E402

from simlib import grading

cloudpickle.register_pickle_by_value(families)


@pytest.mark.parametrize("exercise", sorted(families.FAMILY3))
def test_family3_the_algorithm_is_checked_not_only_the_output(exercise, clusters):
    """Right numbers by all_gather (one through an alias bound before the grader ran): the dispatcher-level
    recorder sees it, and the contract (ring: neighbours-only send/recv; MoE: all-to-all) fails it."""
    report = grading.check(exercise, families.FAMILY3[exercise], clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed, report
    failed = report.failed()[0]
    assert "all_gather" in failed.detail and ("ring" in failed.name or "all-to-all" in failed.name), failed.line()
    assert all("ring" in r.name or "all-to-all" in r.name for r in report.failed()), (
        "only the contract fails: the numbers are right"
    )


def test_family6_counts_come_from_the_graders_recorder(clusters):
    """A column-parallel layer that all-gathers the weights through an alias: the old spy on dist.all_reduce saw
    one all-reduce each way and passed it; the dispatcher-level recorder sees the all-gathers."""
    report = grading.check("tp_linear", families.FAMILY6["tp_linear"], clusters=clusters, quiet=True)
    assert not report.passed, report
    assert [r.name for r in report.failed()] == [
        f"{n} ranks: one all-reduce in forward, one in backward" for n in (2, 3, 4)
    ], report.results
    assert "all_gather" in report.failed()[0].detail


def test_family4_moe_sizes_that_differ_from_each_other(clusters):
    """Tokens per rank (6 or 7) differ from the hidden size (8) and from one world size to the next: an answer
    that takes the token count for the hidden size passed when both were 8."""
    report = grading.check(
        "moe_dispatch", families.FAMILY4["moe_dispatch"], clusters=clusters, quiet=True, first_failure=True
    )
    assert not report.passed and report.status in ("fail", "error"), report


def test_family4_an_answer_right_only_on_the_lessons_instance_fails_on_fresh_ones():
    report = grading.check("checkpoint_placement", families.FAMILY4["checkpoint_placement"], quiet=True)
    assert [r.name for r in report.failed()] == ["40 fresh random problems: least recomputation that fits"], report
    assert "seed" in report.failed()[0].detail and all(r.passed for r in report.results[:-1])


@pytest.mark.parametrize("bug", sorted(families.FAMILY2))
def test_family2_problems_are_drawn_at_check_time_and_the_reference_is_refused(bug):
    report = grading.check("checkpoint_placement", families.FAMILY2[bug], quiet=True)
    assert not report.passed and all(r.passed for r in report.results[:-1]), report
    failed = report.failed()[0]
    assert failed.name.startswith("40 fresh random problems"), failed.line()
    if bug == "calls_the_reference":  # refused in the answer's box, whatever it does to a profile hook
        assert "simlib.grading" in failed.detail or "open " in failed.detail, failed.line()


def test_family6_every_call_of_an_answer_run_in_the_graders_process_has_a_time_limit(monkeypatch):
    from simlib.grading import core

    monkeypatch.setattr(core, "ANSWER_CALL_LIMIT", 1.0)
    report = grading.check("checkpoint_placement", families.FAMILY6["checkpoint_placement"], quiet=True)
    failed = report.failed()
    # the limit is scaled by the machine's load (simlib.grading.busy): 1 s on a quiet machine, more on a busy one
    assert len(failed) == 1 and failed[0].status == "timeout" and "ran longer than" in failed[0].detail, report


def test_family6_the_full_state_check_draws_from_every_generator(cluster2):
    """A state that saves torch's CPU generator only: the task now draws from Python's and NumPy's too (and
    CUDA's where there is one), so the resumed run leaves the uninterrupted one."""
    report = grading.check(
        "full_state", families.FAMILY6["full_state"], clusters={2: cluster2}, quiet=True, first_failure=True
    )
    assert not report.passed, report
    assert [r.name for r in report.failed()] == [
        "2 ranks: the resumed curve equals the uninterrupted one, bit for bit"
    ], "\n".join(r.line() for r in report.results)


def test_family3_a_star_of_sends_is_not_a_ring(clusters):
    """Send/recv only, the numbers right and the total volume a ring's: only the per-rank contract (neighbours only,
    each rank sending its 2(n-1)/n share; and what its messages carry, which on 2 ranks - where rank 0 is everyone's
    neighbour - is the only tell: rank 0's first message is the finished sum, not its own chunk) sees that it is not
    the algorithm the exercise teaches."""
    report = grading.check("ring_all_reduce", families.all_reduce_through_rank0, clusters=clusters, quiet=True)
    assert not report.passed, report
    assert all(
        "neighbours" in r.name or "partial sums" in r.name or "on the wire" in r.name for r in report.failed()
    ), [r.line() for r in report.failed()]
    assert any("neighbours" in r.name for r in report.failed())


def test_family4_softmax_without_the_max_fails_on_large_float32_scores(clusters):
    """The red team's ring attention without the running max: right on every float64 case (exp reaches 709 there),
    it overflows on float32 scores past 88.7, which the check now draws (the lesson's point is the online softmax)."""
    import pathlib
    import runpy

    path = (
        pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "redteam" / "ring_attention__no_max_subtraction.py"
    )
    answer = runpy.run_path(str(path))["ANSWER"]
    report = grading.check("ring_attention", answer, clusters=clusters, quiet=True)
    assert not report.passed, report
    assert [r.name for r in report.failed()] == [r.name for r in report.results if "float32" in r.name]


def test_family4_a_sharded_optimizer_that_forwards_only_lr_fails(clusters):
    """The red team's ShardedOptimizer passing only lr to its inner optimizer: right at AdamW's defaults, 8.5e-3
    off with the betas, eps and weight decay the check now sets."""
    import pathlib
    import runpy

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "redteam" / "sharded_optimizer__only_lr.py"
    report = grading.check("sharded_optimizer", runpy.run_path(str(path))["ANSWER"], clusters=clusters, quiet=True)
    assert [r.name for r in report.failed()] == [r.name for r in report.results if "keyword" in r.name], report


# ---- family 1: the learner's code runs only in worker processes ----


@pytest.fixture
def graders_own_code():
    """The grader's functions that family 1's answers replace, as they were; put back after the test (so a failure
    on code without the isolation does not spread to later tests)."""
    from simlib.grading import core, evidence, model_parallel, vision_finance

    before = dict(
        post_init=core.Result.__post_init__,
        mp_result=model_parallel.Result,
        vf_result=vision_finance.Result,
        load_fixed=vision_finance.load_fixed,
        check=dict(grading.EXERCISES),
    )
    yield before
    core.Result.__post_init__ = before["post_init"]
    model_parallel.Result, vision_finance.Result = before["mp_result"], before["vf_result"]
    vision_finance.load_fixed = evidence.load_fixed
    grading.EXERCISES.update(before["check"])


@pytest.mark.parametrize("member", sorted(families.family1()))
def test_family1_the_answers_code_runs_only_in_workers(member, graders_own_code, clusters):
    """A constructor, a record's property and a dict subclass's items() that patch the grader, and a result that
    comes back from a worker as a tensor subclass whose unpickling patches it: each runs (if at all) in a worker,
    the verdict fails the wrong answer, and the grader's functions here are the ones it started with. (Where the
    patch lands in a worker it changes Result there, which no verdict reads: a Result cannot cross back.)"""
    from simlib.grading import core

    exercise, answer = families.family1()[member]
    report = grading.check(exercise, answer, clusters=clusters, quiet=True)
    assert core.Result.__post_init__ is graders_own_code["post_init"], "the answer's code ran in the grading process"
    assert dict(grading.EXERCISES) == graders_own_code["check"]
    assert not report.passed and report.failed(), "\n".join(r.line() for r in report.results)
    if member == "worker_result":
        assert "sent back only plain data" in report.failed()[0].name, report.failed()[0].line()
        assert "_TensorThatPatches" in report.failed()[0].detail, report.failed()[0].line()
