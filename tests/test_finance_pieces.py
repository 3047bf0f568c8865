"""The finance project's learner pieces (issue 48): ``paths`` and ``grad_average`` run inside its training on every
rank, the course's own pieces give the very run without pieces, a wrong piece changes the run or stops it with a
clear error, and each planted wrong answer (tests/planted/finance_pieces.py) is caught by the check that names it."""

import math

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from planted import finance_pieces as planted  # noqa: E402

from simlib import grading
from simlib.projects.finance.pieces import average_by_count, rank_blocks, rank_paths

cloudpickle.register_pickle_by_value(planted)


# ---- the learner's pieces, as a learner writes them (sent to the workers by value) ----


def my_paths(task, step, rank, world):
    from simlib.projects.seeding import generator

    blocks = task.global_batch // task.block
    out = [torch.empty(0, task.days + 1)]
    for b in range(rank * blocks // world, (rank + 1) * blocks // world):
        z = torch.randn(task.block, task.days, generator=generator(task.seed, 5, step, b))
        dt = 1 / 252
        log_s = torch.cumsum(-0.5 * task.vol**2 * dt + task.vol * math.sqrt(dt) * z, dim=1)
        out.append(torch.cat([torch.ones(task.block, 1), torch.exp(log_s)], dim=1))
    return torch.cat(out)


def summed_not_averaged(params, loss, count, group=None):
    """A wrong piece: all-reduces count * grad but never divides by the total count."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(count)
            dist.all_reduce(p.grad, group=group)
    return loss


def wrong_width(task, step, rank, world):
    return rank_paths(task, step, rank, world)[:, :-1]


def _run(cluster, pieces=None):
    from simlib.projects.runner import run_project

    record, state = run_project(
        "finance", 2, quick=True, verbose=False, steps=4, eval_every=4, cluster=cluster, pieces=pieces or {}
    )
    return record, state


def test_rank_blocks_are_contiguous_balanced_and_cover_every_block():
    for blocks in range(0, 12):
        for world in range(1, 6):
            shares = [rank_blocks(blocks, r, world) for r in range(world)]
            assert [b for s in shares for b in s] == list(range(blocks))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_the_pieces_run_inside_the_training_and_the_courses_equal_no_pieces(cluster2):
    """The course's pieces (what USE_GIVEN switches on) give the very run without pieces, and the summary lists the
    slots; a learner's paths piece (my_paths, sent by value) with a wrong grad_average trains another model: the
    learner's code is what ran on every rank."""
    base, base_state = _run(cluster2)
    given, given_state = _run(cluster2, {"paths": rank_paths, "grad_average": average_by_count})
    assert base.summary["pieces"] == [] and given.summary["pieces"] == ["grad_average", "paths"]
    losses = [r["loss"] for r in base.rows]
    assert losses and losses == [r["loss"] for r in given.rows]
    flat_a, flat_b = _flatten(base_state), _flatten(given_state)
    assert flat_a and flat_a.keys() == flat_b.keys() and all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a)
    wrong, _ = _run(cluster2, {"paths": my_paths, "grad_average": summed_not_averaged})
    assert wrong.summary["pieces"] == ["grad_average", "paths"]
    assert [r["loss"] for r in wrong.rows][0] == losses[0]  # my_paths draws the course's paths: the same first loss
    assert [r["loss"] for r in wrong.rows] != losses  # then the learner's wrong average trains another model


def test_a_paths_piece_of_the_wrong_shape_stops_the_run_naming_the_rank(cluster2):
    with pytest.raises(Exception, match=r"rank \d, step 0: your paths piece returned"):
        _run(cluster2, {"paths": wrong_width})


def _flatten(state, prefix=""):
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(state, torch.Tensor):
        out[prefix] = state
    return out


PATHS_CAUGHT = {
    "floor_share_drops_the_rest": "each rank returns its share",
    "seed_plus_rank": "no path repeats",
    "same_seed_on_every_rank": "no path repeats",
    "no_ito_term": "the paths are the model's",
    "global_torch_seed": "deterministic",
    "seeded_by_rank_and_step": "one process equals many",
}
AVERAGE_CAUGHT = {
    "mean_of_means": ("gradients equal one process's", "plain mean of means"),
    "nan_from_the_empty_rank": ("gradients equal one process's", ""),
    "all_gather_then_sum": ("on the wire", "all_gather"),
    "grads_for_unused_parameters": ("gradients equal one process's", "leave p.grad None"),
}
CASES = [("finance_paths", f, (PATHS_CAUGHT[f.__name__], "")) for f in planted.PATHS] + [
    ("finance_grad_average", f, AVERAGE_CAUGHT[f.__name__]) for f in planted.GRAD_AVERAGE
]


@pytest.mark.parametrize("exercise,answer,caught", CASES, ids=[c[1].__name__ for c in CASES])
def test_each_planted_wrong_piece_is_caught_by_the_check_that_names_it(exercise, answer, caught, clusters):
    report = grading.check(exercise, answer, clusters=clusters, quiet=True, first_failure=True)
    lines = "\n".join(r.line() for r in report.results)
    failed = report.failed()
    assert not report.passed and failed and caught[0] in failed[0].name, lines
    assert caught[1] in failed[0].hint, lines


@pytest.mark.parametrize("exercise,answer", [("finance_paths", rank_paths), ("finance_grad_average", average_by_count)])
def test_the_courses_pieces_pass_their_checks(exercise, answer, clusters):
    report = grading.check(exercise, answer, clusters=clusters, quiet=True)
    assert report.passed, "\n".join(r.line() for r in report.results)


@pytest.mark.parametrize("build", planted.MILESTONE, ids=[b.__name__ for b in planted.MILESTONE])
def test_the_pieces_milestone_refuses_answers_without_the_learners_pieces(build, clusters):
    report = grading.check("finance_pieces_milestone", build(), clusters=clusters, quiet=True, first_failure=True)
    assert not report.passed, "\n".join(r.line() for r in report.results)


def teardown_module():
    grading.close()
