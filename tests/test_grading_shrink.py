"""The smallest failing instance a hint names (simlib.grading.instances.shrink): Hypothesis replays the drawn failing
instance and shrinks from it, within a budget of runs; a slow run is never called failing, and the planted wrong
answers of the test suite (first_failure) search nothing. No workers: ``differs`` stands for a run on them."""

from types import SimpleNamespace

from simlib.grading.instances import around, shrink, smallest_words
from simlib.grading.results import HANG, Result, _Stop

FIRST = dict(world=4, n=40, dtype="float64", seed=12345)


def _strategy():
    return around(FIRST, dict(world=(2, 3, 4), n=1), dict(dtype="float32"), keep=lambda i: i["n"] % 2 == 0)


def test_shrinks_from_the_drawn_instance_to_the_smallest_that_fails():
    runs = []

    def differs(i):  # wrong from 3 ranks and 10 elements on, whatever the dtype
        runs.append(i)
        return f"max error {i['n']}" if i["world"] >= 3 and i["n"] >= 10 else ""

    small, what = shrink(_strategy(), differs, FIRST, budget=20, seconds=60)
    assert (small["world"], small["n"], small["dtype"], small["seed"]) == (3, 10, "float32", 12345), small
    assert what == "max error 10" and FIRST not in runs  # the drawn instance is known to fail: not run again
    assert all(i["n"] <= 40 and i["n"] % 2 == 0 for i in runs)  # never above the drawn one, never a rejected one
    words = smallest_words(small, what)
    assert "world 3" in words and "n 10" in words and "max error 10" in words


def test_a_small_budget_keeps_the_smallest_found_so_far():
    runs = []
    small, what = shrink(_strategy(), lambda i: runs.append(i) or "wrong", FIRST, budget=3, seconds=60)
    assert len(runs) <= 3 and (what == "" or small["n"] <= 40)


def test_a_slow_run_ends_the_search_and_is_not_called_failing():
    grader = SimpleNamespace(first_failure=False, unanswered=False, timeout=30.0, second_chance=True)

    def differs(i):
        assert grader.timeout <= 5.0 and not grader.second_chance  # the search's runs: short, no retry
        raise _Stop(Result("your code finished", False, status=HANG))

    assert shrink(_strategy(), differs, FIRST, grader) == (FIRST, "")
    assert grader.timeout == 30.0 and grader.second_chance  # put back


def test_nothing_is_searched_for_first_failure():
    grader = SimpleNamespace(first_failure=True, unanswered=False)
    assert shrink(_strategy(), lambda i: 1 / 0, FIRST, grader) == (FIRST, "")
