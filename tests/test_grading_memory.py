"""Lesson 07 graders: every planted bug is caught, with a hint that points at it.

(Solutions passing and stubs reporting "not implemented yet" are checked for every solution in tests/test_grading.py.)
"""

import cloudpickle
import pytest
from planted import memory as planted  # noqa: E402

from simlib import grading

cloudpickle.register_pickle_by_value(planted)

PLANTED = {
    "sharded_optimizer": {f.__name__: f for f in planted.SHARDED_OPTIMIZER},
    "zero3_linear": {f.__name__: f for f in planted.ZERO3_LINEAR},
    "checkpoint_placement": {f.__name__: f for f in planted.CHECKPOINT_PLACEMENT},
}
HINTS = {
    "not_sharded": "owns",
    "no_broadcast": "dist.broadcast",
    "broadcast_from_rank_zero": "not rank 0",
    "saves_the_gathered_weight": "save the input and the shard",
    "all_reduce_instead_of_reduce_scatter": "reduce-scatter gives each rank just its rows",
    "gradient_not_averaged": "divide by the world size",
    "takes_the_next_ranks_rows": "another rank's rows",
    "checkpoint_everything": "recomputes the whole forward",
    "largest_first": "largest blocks first",
    "forgets_the_kept_inputs": "still keeps its input",
    "ignores_the_budget": "checkpoint more blocks",
    # issue 19: memory while it steps, saved tensors anywhere in the graph, 3 ranks, instances, hints
    "full_state_during_step": "at the peak of step()",
    "moments_in_own_dicts": "keep no other per-parameter state",
    "bitmask_owner_in_broadcast": "for any world size",
    "weight_saved_behind_a_reshape": "does not hide it",
    "weight_saved_below_a_scale": "does not hide it",
    "zero_grad_of_inner_only": "not only the inner optimizer's",
    "best_ratio_first": "nor the best ratio first",
    "strict_budget": "not <",
    # issue 47: problems of up to 12 blocks; the watch in a box of its own, out of the answer's reach
    "capped_at_eight_blocks": "right on the lesson's model but not on another",
    "switches_off_the_watch": "calling the grader's reference is not an answer",
    "state_outside_torch": "owns",
    "no_empty_shard_guard": "owns no parameter",
    # issue 47 (drawn instances): a float64 layer gathered into a float32 buffer; [] when nothing fits
    "gathers_into_the_default_dtype": "not the default float32",
    "empty_when_nothing_fits": "return every block",
}


EVERY_RUN = {"bitmask_owner_in_broadcast"}


def test_planted_bugs_are_listed():
    assert all(len(bugs) >= 3 for bugs in PLANTED.values())
    assert set(HINTS) == {name for bugs in PLANTED.values() for name in bugs}
    assert set(PLANTED) <= set(grading.EXERCISES)


@pytest.mark.parametrize("exercise,bug", [(e, b) for e, bugs in PLANTED.items() for b in bugs])
def test_planted_bug_is_caught(exercise, bug, clusters):
    # first_failure: no run after the one that catches it (3 of the 4 sharded-optimizer runs saved); the owner
    # bitmask also fails the 2-rank peak, and its own hint comes from the 3-rank run: every run for it
    report = grading.check(
        exercise, PLANTED[exercise][bug], clusters=clusters, quiet=True, first_failure=bug not in EVERY_RUN
    )
    assert not report.passed and report.status in ("fail", "error"), report
    hints = " ".join(r.hint for r in report.failed())
    assert HINTS[bug] in hints, "\n".join(r.line() for r in report.results)


# ---- issue 33, family 5: every allocation weighed (NumPy too), what stays alive after forward, the sum saved ----
from planted import m5_memory  # noqa: E402

cloudpickle.register_pickle_by_value(m5_memory)
M5 = [("sharded_optimizer", f) for f in m5_memory.SHARDED_OPTIMIZER] + [
    ("zero3_linear", f) for f in m5_memory.ZERO3_LINEAR
]


@pytest.mark.parametrize("exercise,bug", M5, ids=[b.__name__ for _, b in M5])
def test_family5_memory_weighed_whole(exercise, bug, clusters):
    report = grading.check(exercise, bug, clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed and report.status in ("fail", "error"), "\n".join(r.line() for r in report.results)
    hints = " ".join(r.hint for r in report.failed())
    assert m5_memory.HINTS[bug.__name__] in hints, "\n".join(r.line() for r in report.results)


def test_what_a_call_leaves_alive_counts_however_it_is_held():
    """weighing._alive_after: a tensor kept in a tuple, a dict or a list counts; one dropped does not."""
    import torch

    from simlib.grading.weighing import _alive_after

    kept = []
    assert _alive_after(lambda: kept.append(((torch.zeros(1000),), {"k": torch.zeros(500)}))) >= 6000
    assert _alive_after(lambda: torch.zeros(1000).sum()) == 0
