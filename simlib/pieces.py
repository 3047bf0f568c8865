"""A learner's own code inside the course's training: the projects' *pieces*.

A project declares the places where a learner's code can take the place of the course's own (its *slots*) in its
``run.py``::

    PIECES = {"grad_sync": Slot("grad_sync", what="...", given="simlib.parallel.data:DataParallelBucket",
                                check="gpt_grad_sync", interface="class(module, bucket_cap_mb)")}

A run given ``pieces={"grad_sync": MyBucketSync}`` (``simlib.train.train(..., pieces=)``, a project's ``run``,
``simlib.projects.runner.run_project``) uses the learner's object at that slot on every rank; the library asks at
the slot with :func:`get` and uses its own piece when it gets None. The run's summary lists the learner's pieces
the library actually asked for (``summary["pieces"]``; a piece for a slot the plan never reaches is not there),
which is what a project's milestone checks: the model reached its target *with the learner's code in the loop*. A stuck learner switches the course's own piece on by leaving the slot out (or by
passing ``slot.load_given()``); the run then says so and the milestone is not earned by it.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

__all__ = ["Slot", "using", "get", "active", "used", "load", "check_pieces"]


@dataclass(frozen=True)
class Slot:
    """One place in a project's training where a learner's code can run."""

    name: str  # the key in ``pieces={...}``
    what: str  # one line: what the piece does, in the learner's words
    given: str  # "module:attribute" of the course's own piece (the fallback)
    check: str  # the grading check that grades the piece alone (``simlib.grading.check(check, answer)``)
    interface: str = ""  # the call the slot makes, e.g. "class(module, bucket_cap_mb) with .finish()"

    def load_given(self):
        """The course's own piece for this slot (imported now)."""
        return load(self.given)


def load(path: str):
    """The object a ``"module:attribute"`` path names (imported now)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


_ACTIVE: dict[str, object] = {}
_USED: set = set()  # the slots whose learner's piece the library asked for (and so ran) in the run now going on


def check_pieces(pieces, slots: dict | None = None) -> dict:
    """``pieces`` as a plain dict, or a ValueError naming what is wrong: not a mapping, a name that is not one of
    ``slots`` (when given: the project's ``PIECES``), or a piece that cannot be called."""
    if pieces is None:
        return {}
    if not isinstance(pieces, dict):
        raise ValueError(f"pieces must be a dict {{slot name: your class or function}}, got {type(pieces).__name__}")
    out = {}
    for name, piece in pieces.items():
        if slots is not None and name not in slots:
            known = ", ".join(f"{k!r} ({s.what})" for k, s in slots.items()) or "none"
            raise ValueError(f"pieces: {name!r} is not a slot of this project; its slots: {known}")
        if piece is None:
            continue  # a slot left empty: the course's own piece runs there
        if not callable(piece):
            raise ValueError(
                f"pieces[{name!r}] must be your class or function (something callable), got {type(piece).__name__}"
            )
        out[name] = piece
    return out


@contextlib.contextmanager
def using(pieces):
    """Within the block, :func:`get` returns the learner's pieces (a dict, or None for none); as it was after."""
    global _ACTIVE, _USED
    before = _ACTIVE, _USED
    _ACTIVE, _USED = {**check_pieces(pieces)}, set()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE, _USED = before


def get(name: str):
    """The learner's piece for slot ``name`` in the run now going on, or None (then the library uses its own).
    A slot asked for is counted as used (:func:`used`)."""
    piece = _ACTIVE.get(name)
    if piece is not None:
        _USED.add(name)
    return piece


def active() -> list[str]:
    """The slots the run now going on fills with the learner's code, sorted."""
    return sorted(_ACTIVE)


def used() -> list[str]:
    """The slots whose learner's piece this run's code asked for so far (a piece given for a slot the plan never
    reaches, e.g. a tensor-parallel piece in a data-parallel run, is not among them), sorted."""
    return sorted(_USED)
