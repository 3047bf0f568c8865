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
        assert pieces.get("sync") is _mine and pieces.active() == ["sync"]
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


def test_a_run_lists_the_pieces_it_used_on_every_rank():
    from simlib.projects import registry
    from simlib.projects.runner import run_project

    registry.register("template", "simlib.projects.template.run")  # no slots declared
    try:
        _runs_with_pieces(run_project)
    finally:
        registry.PROJECTS.pop("template")


def _runs_with_pieces(run_project):
    record = run_project("template", 1, quick=True, verbose=False, steps=2, pieces={})
    assert record[0].summary["pieces"] == []
    with pytest.raises(ValueError, match="not a slot of this project"):
        run_project("template", 1, quick=True, verbose=False, steps=2, pieces={"sync": _mine})
