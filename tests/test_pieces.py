"""simlib.pieces: the learner's code at a project's slots (each project's own slots are tested with its pieces)."""

import pytest

from simlib import pieces
from simlib.pieces import Slot, check_pieces


def _mine(x):
    return x


SLOTS = {"sync": Slot("sync", what="averages the gradients", given="simlib.pieces:active", check="none")}


def test_a_piece_is_there_inside_the_block_only():
    assert pieces.get("sync") is None
    with pieces.using({"sync": _mine}):
        assert pieces.used() == []  # given, not yet asked for
        assert pieces.get("sync") is _mine and pieces.active() == ["sync"] and pieces.used() == ["sync"]
        with pieces.using(None):  # a nested run with none
            assert pieces.get("sync") is None
        assert pieces.get("sync") is _mine
    assert pieces.get("sync") is None and pieces.active() == []


def test_a_wrong_piece_is_refused_naming_the_slots():
    with pytest.raises(ValueError, match="'sink' is not a slot of this project; its slots: 'sync'"):
        check_pieces({"sink": _mine}, SLOTS)
    with pytest.raises(ValueError, match="must be your class or function"):
        check_pieces({"sync": 3}, SLOTS)
    with pytest.raises(ValueError, match="must be a dict"):
        check_pieces([_mine], SLOTS)
    assert check_pieces({"sync": None}, SLOTS) == {}  # left empty: the course's own piece runs
    assert SLOTS["sync"].load_given() is pieces.active


def test_a_run_lists_the_pieces_it_used_on_every_rank(cluster2):
    from simlib.projects import registry
    from simlib.projects.runner import run_project

    registry.register("template", "simlib.projects.template.run")  # no slots declared
    try:
        _runs_with_pieces(run_project, cluster2)
    finally:
        registry.PROJECTS.pop("template")


def _runs_with_pieces(run_project, cluster2):
    record = run_project("template", 2, quick=True, verbose=False, steps=2, pieces={}, cluster=cluster2)
    assert record[0].summary["pieces"] == []
    with pytest.raises(ValueError, match="not a slot of this project"):
        run_project("template", 2, quick=True, verbose=False, steps=2, pieces={"sync": _mine}, cluster=cluster2)


# ---- a project's milestone earned with the learner's pieces (simlib.grading.pieces_milestone) ----
PIECED = "pieced"


@pytest.fixture(scope="module")
def pieced(tmp_path_factory):
    """The template project copied to <tmp>/pieced_diabetes/ with one slot, ``loss``, and that slot's exercise
    ``pieced_loss``; registered as ``pieced``; undone after the module."""
    import importlib.util
    import shutil
    import sys
    from pathlib import Path

    import cloudpickle

    from simlib import grading
    from simlib.projects import registry

    folder = tmp_path_factory.mktemp("pieced") / "pieced_diabetes"
    shutil.copytree(Path(__file__).resolve().parents[1] / "simlib" / "projects" / "template", folder)
    task_py = folder / "task.py"
    source = task_py.read_text()
    mse = "return nn.functional.mse_loss(output, target)"
    assert mse in source
    task_py.write_text(
        source.replace(
            mse,
            "from simlib import pieces\n\n        return (pieces.get('loss') or nn.functional.mse_loss)(output, target)",
        )
    )
    with open(folder / "run.py", "a") as f:
        f.write(
            '\nfrom simlib.pieces import Slot\n\nPIECES = {"loss": Slot("loss", what="the mean squared error", '
            'given="torch.nn.functional:mse_loss", check="pieced_loss")}\n'
        )
    spec = importlib.util.spec_from_file_location("pieced_diabetes", folder / "__init__.py")
    package = importlib.util.module_from_spec(spec)
    sys.modules["pieced_diabetes"] = package
    spec.loader.exec_module(package)
    cloudpickle.register_pickle_by_value(package)

    def _loss_error(loss):  # in a worker: the piece against torch's on values drawn here
        import torch

        x, y = torch.randn(37, 1) * 3, torch.randn(37, 1)
        return float((loss(x, y) - torch.nn.functional.mse_loss(x, y)).abs())

    @grading.exercise("pieced_loss")
    def _pieced_loss(answer, grader):
        err = grader.ask(_loss_error, answer)
        yield grading.Result("equals the mean squared error", err < 1e-6, "the mean over samples", f"{err:.3g}")

    try:
        yield registry.register(PIECED, "pieced_diabetes.run", "the template with a loss slot")
    finally:
        registry.PROJECTS.pop(PIECED, None)
        for name in ("pieced_loss", "pieced_milestone", "pieced_pieces_milestone"):
            grading.EXERCISES.pop(name, None)
        cloudpickle.unregister_pickle_by_value(package)
        for mod in [m for m in sys.modules if m.startswith("pieced_diabetes")]:
            del sys.modules[mod]


def _mse(output, target):  # the learner's right piece
    return ((output - target) ** 2).mean()


def _sum_se(output, target):  # a wrong one: a sum where the mean is asked
    return ((output - target) ** 2).sum()


def test_the_pieces_milestone_trains_and_rechecks_with_the_learners_pieces(pieced, cluster2):
    from simlib import grading
    from simlib.grading.pieces_milestone import pieces_milestone
    from simlib.projects.runner import run_project

    grading.milestone(PIECED)
    name = pieces_milestone(PIECED)
    clusters = {1: grading.cluster(1), 2: cluster2}

    def grade(answer):
        return grading.check(name, answer, clusters=clusters, quiet=True)

    record, state = run_project(PIECED, 2, quick=True, verbose=False, cluster=cluster2, pieces={"loss": _mse})
    assert record.summary["pieces"] == ["loss"]
    task = pieced.settings(True)["task"]
    report = grade((task, record, state, {"loss": _mse}))
    assert report.passed, report
    assert not any("in this session" in r.name for r in report.results)  # graded: nothing passed before
    report = grade((task, record, state, {"loss": _mse}))  # the same piece again: its verdict is remembered
    assert report.passed and any("[loss] passed" in r.name and "in this session" in r.name for r in report.results)
    # the course's own piece in the run: no milestone, whatever the answer's pieces say
    record_given, state_given = run_project(PIECED, 2, quick=True, verbose=False, cluster=cluster2, steps=2)
    report = grade((task, record_given, state_given, {"loss": _mse}))
    assert not report.passed and "had your code at every slot" in report.failed()[0].name, report
    # a wrong piece fails its own check before any re-run; an empty slot is refused
    report = grade((task, record, state, {"loss": _sum_se}))
    assert not report.passed and report.failed()[0].name.startswith("[loss]"), report
    import torch

    report = grade((task, record, state, {"loss": torch.nn.functional.mse_loss}))  # the course's own, passed
    assert not report.passed and "the course's own piece" in report.failed()[0].detail, report
    report = grade((task, record, state, {}))
    assert not report.passed and "fill every slot" in report.failed()[0].name, report
    assert grade(None).status == grading.TODO


def _helper(x):
    return x * 2


def _uses_helper(x):
    return _helper(x) + 1


def test_a_piece_fingerprint_covers_what_it_reads():
    from simlib.grading.fingerprint import fingerprint

    before = fingerprint(_uses_helper)
    assert before == fingerprint(_uses_helper) and before != fingerprint(_mse)
    global _helper
    saved = _helper
    try:
        _helper = lambda x: x * 3  # noqa: E731 - a helper in another cell, changed after the check
        assert fingerprint(_uses_helper) != before
    finally:
        _helper = saved
    assert fingerprint(_uses_helper) == before and fingerprint(3) is None
