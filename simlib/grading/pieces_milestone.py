"""A project's milestone earned with the learner's own pieces in the training loop (issue 48, item 1).

``pieces_milestone(name)`` registers the graded exercise ``"<name>_pieces_milestone"``. Its answer is what the
project's run with the learner's pieces returns, plus those pieces: ``(task, record, state, pieces)``, where
``pieces = {slot: the learner's class or function}`` for every slot the project declares (``PIECES`` in its
``run.py``, :mod:`simlib.pieces`). The checks, in order, each only once the ones before passed:

1. the answer's shape, and pieces for **every** slot (a slot left to the course's own piece earns no milestone);
2. each piece on its own, by that slot's exercise (``Slot.check``): secret instances drawn now, the piece run in the
   grader's workers, like any exercise. A piece that fails there fails the milestone (the run below is not re-run).
   A piece that passed that exercise earlier in this process with the very same code (:mod:`.fingerprint`: its
   functions and what they read) is not graded again (the notebook's check cell, then the milestone);
3. the record says its run had the learner's code at every slot (``summary["pieces"]``, which the trainer writes
   from the pieces it actually used on every rank);
4. the project's own milestone (``"<name>_milestone"``): the record, the metric recomputed from the weights, the
   target, the budget — and the re-runs on the grader's workers (the first steps, then the whole recorded run)
   train **with the answer's pieces** (:attr:`Grader.pieces_from`), so the weights must be what the learner's code
   makes: a record from a run with the course's pieces does not match them unless the learner's pieces compute
   the very same thing.
"""

from __future__ import annotations

from .core import EXERCISES, TODO, Result, exercise
from .fingerprint import PIECE_CHECKS, fingerprint, passed_before, remember
from .sent import Sent

__all__ = ["pieces_milestone", "pieces_of_answer", "run_with_answer_pieces"]


def pieces_of_answer(answer) -> dict:
    """In a worker: the answer's pieces dict ({} for a 3-tuple answer, which has none)."""
    if isinstance(answer, tuple) and len(answer) == 4 and isinstance(answer[3], dict):
        return answer[3]
    return {}


def run_with_answer_pieces(answer, fn, args):
    """In a worker: ``fn(*args, pieces=<the answer's pieces>)`` (the re-runs' harness when pieces are graded)."""
    return fn(*args, pieces=pieces_of_answer(answer))


def _is_given(piece, given) -> bool:
    """The course's own piece passed as the learner's: the object itself, or a subclass that defines nothing."""
    if piece is given or getattr(piece, "__wrapped__", None) is given:
        return True
    if isinstance(piece, type) and isinstance(given, type) and issubclass(piece, given):
        own = [k for k, v in vars(piece).items() if callable(v) or isinstance(v, (staticmethod, classmethod))]
        return not own
    return False


def _shape(answer, slots):
    """In a worker: what the checks need to know of the answer's shape, as plain data (``slots``: {name: the
    slot's given, "module:attribute"})."""
    from ..pieces import load

    if not isinstance(answer, tuple) or len(answer) != 4:
        return {"error": f"a {type(answer).__name__}" + (f" of {len(answer)}" if isinstance(answer, tuple) else "")}
    pieces = answer[3]
    if not isinstance(pieces, dict):
        return {"error": f"pieces is a {type(pieces).__name__}, not a dict"}
    summary = getattr(answer[1], "summary", None)
    used = summary.get("pieces") if isinstance(summary, dict) else None
    course = sorted(str(k) for k, v in pieces.items() if k in slots and _is_given(v, load(slots[k])))
    return {
        "course": course,
        "given": sorted(str(k) for k, v in pieces.items() if v is not None and k not in course),
        "callable": sorted(str(k) for k, v in pieces.items() if callable(v)),
        "used": sorted(str(x) for x in used) if isinstance(used, list) else None,
    }


def _piece(answer, slot: str):
    """In a worker: one piece of the answer as (its fingerprint (:mod:`.fingerprint`), its cloudpickle bytes, sent
    on to that piece's own exercise when it was not graded before)."""
    import cloudpickle

    return fingerprint(answer[3][slot]), cloudpickle.dumps(answer[3][slot])


def _prefixed(result: Result, slot: str) -> Result:
    import dataclasses

    return dataclasses.replace(result, name=f"[{slot}] {result.name}")


def pieces_milestone(name: str, base: str | None = None) -> str:
    """Register ``"<name>_pieces_milestone"`` for project ``name`` (its ``PIECES`` and its milestone exercise
    ``base``, default ``"<name>_milestone"``) and return the exercise's name."""
    from ..projects.registry import get

    slots = get(name).pieces
    if not slots:
        raise ValueError(f"project {name!r} declares no PIECES in {get(name).module}: nothing for a learner to write")
    base = base or f"{name}_milestone"
    PIECE_CHECKS.update(slot.check for slot in slots.values())
    exercise_name = f"{name}_pieces_milestone"

    @exercise(exercise_name)
    def _with_pieces(answer, grader):
        shape = grader.ask(_shape, answer, {k: s.given for k, s in slots.items()}, what="your answer")
        if shape is None:
            yield Result(
                "the milestone is answered",
                False,
                status=TODO,
                hint=f"not done yet: run the project with pieces={{{', '.join(repr(s) for s in slots)}: ...}} "
                "and pass (task, record, state, pieces)",
            )
            return
        ok = "error" not in shape
        yield Result(
            "the answer is (task, record, state, pieces)",
            ok,
            "pass the tuple the project's run returned, plus the pieces dict you trained with",
            shape.get("error", ""),
        )
        if not ok:
            return
        missing = [s for s in slots if s not in shape["given"]]
        uncallable = [s for s in shape["given"] if s not in shape["callable"]]
        yield Result(
            f"your pieces fill every slot ({', '.join(slots)})",
            not missing and not uncallable,
            "the milestone is earned with your own code at every slot; the course's own piece (the fallback) "
            "earns none: " + "; ".join(f"{s}: {slots[s].what}" for s in missing or uncallable),
            (f"the course's own piece at {shape['course']}; " if shape["course"] else "")
            + (f"missing {missing}" if missing else (f"not callable {uncallable}" if uncallable else "")),
        )
        if missing or uncallable:
            return
        for slot_name, slot in slots.items():  # each piece on its own: secret instances, like any exercise
            print_, data = grader.ask(_piece, answer, slot_name, what=f"your {slot_name}")
            if passed_before(slot.check, print_):
                yield Result(
                    f"[{slot_name}] passed grading.check({slot.check!r}) in this session, with this very code",
                    True,
                    detail="not graded again: the same functions and what they read (simlib grade re-grades all)",
                )
                continue
            piece = Sent(data)
            passed = True
            for result in EXERCISES[slot.check](piece, grader):
                passed = passed and result.passed
                yield _prefixed(result, slot_name)
            if passed:
                remember(slot.check, print_)
            if not passed:
                yield Result(
                    "the milestone's run is checked once every piece passes its own checks",
                    False,
                    f"fix your {slot_name} first (its exercise: grading.check({slot.check!r}, ...)), then train "
                    "again with it",
                )
                return
        used = shape["used"] or []
        yield Result(
            "the record's run had your code at every slot (its summary['pieces'])",
            all(s in used for s in slots),
            "train with pieces={...} for every slot and pass that run's own record",
            f"the record says {shape['used']!r}",
        )
        if not all(s in used for s in slots):
            return
        grader.pieces_from = answer  # the re-runs train with these pieces
        try:
            yield from EXERCISES[base](answer, grader)
        finally:
            grader.pieces_from = None

    return exercise_name
