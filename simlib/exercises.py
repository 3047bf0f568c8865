"""Exercise notebooks, generated from solution notebooks: ``solutions/NN_name.ipynb -> exercises/NN_name.ipynb``.

Markers are nbgrader's (https://nbgrader.readthedocs.io, "Autograded answer" cells)::

    def ring_all_reduce(tensor):
        ### BEGIN SOLUTION
        ...the answer...
        ### END SOLUTION

In a code cell the lines from ``### BEGIN SOLUTION`` to ``### END SOLUTION`` become, at the marker's
indentation, ``# YOUR CODE HERE`` and ``raise NotImplementedError()`` (the stub :mod:`simlib.grading`
reports as "not implemented yet"). In a markdown cell the region becomes ``YOUR ANSWER HERE``. Code
outside the markers (a class skeleton, imports, the check cell) is kept, so an exercise can give half of
a class and ask for two methods. Outputs and execution counts are dropped.

Conventions (lessons 04+ follow them too):
- the cells that hold solution regions are self-contained (their own imports), so :func:`load_answers`
  can run just those cells to get the solved objects for tests;
- ``notebook.metadata["simlib"] = {"exercise": <grading name>, "answer": <variable name>}`` names the
  check and the object it grades (a list of such dicts when a notebook has several exercises).

Command line::

    python -m simlib.exercises            # write exercises/ from solutions/
    python -m simlib.exercises --check    # exit 1 if a committed exercise is stale or missing (CI)
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

__all__ = [
    "BEGIN",
    "END",
    "STUB",
    "strip_solutions",
    "make_exercise",
    "generate",
    "load_answers",
    "exercises_of",
    "main",
]

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "YOUR ANSWER HERE"
ROOT = Path(__file__).resolve().parent.parent
NOTE = (
    "> *Generated from `solutions/{name}` by `python -m simlib.exercises`: edit the solution notebook, "
    "not this file.*\n\n"
)


class MarkerError(ValueError):
    """Unbalanced or nested solution markers."""


def strip_solutions(source: str, cell_type: str = "code") -> tuple[str, int]:
    """Replace each marked region of one cell's source with the stub; return (new source, regions found)."""
    out, inside, regions = [], False, 0
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise MarkerError(f"line {number}: {BEGIN} inside another solution region")
            inside, regions = True, regions + 1
            indent = re.match(r"\s*", line).group(0)
            out += [indent + s for s in STUB] if cell_type == "code" else [indent + MARKDOWN_STUB]
        elif stripped == END:
            if not inside:
                raise MarkerError(f"line {number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{BEGIN} without {END}")
    return "\n".join(out), regions


def make_exercise(solution, name: str = "") -> nbformat.NotebookNode:
    """The exercise notebook for one solution notebook (a new object; the solution is not changed)."""
    nb = copy.deepcopy(solution)
    total = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("code", "markdown"):
            try:
                cell.source, found = strip_solutions(cell.source, cell.cell_type)
            except MarkerError as exc:
                raise MarkerError(f"{name} cell {index}: {exc}") from None
            total += found
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    if not total:
        raise MarkerError(f"{name}: no '{BEGIN}' region, so the exercise would equal the solution")
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is not None:
        first.source = NOTE.format(name=name) + first.source
    return nb


def _text(nb) -> str:
    return nbformat.writes(nb) + "\n"


def generate(
    solutions: Path | str = ROOT / "solutions", exercises: Path | str = ROOT / "exercises", check: bool = False
) -> list[str]:
    """Write (or with ``check`` compare) every exercise; return the names that were (or are) out of date.

    With ``check``, an exercise without a solution is reported too (it would never be regenerated).
    """
    solutions, exercises = Path(solutions), Path(exercises)
    stale = []
    names = sorted(p.name for p in solutions.glob("[0-9]*.ipynb"))
    for name in names:
        text = _text(make_exercise(nbformat.read(solutions / name, as_version=4), name))
        target = exercises / name
        if target.exists() and target.read_text() == text:
            continue
        stale.append(name)
        if not check:
            exercises.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    if check:
        stale += [f"{p.name} (no solution)" for p in sorted(exercises.glob("[0-9]*.ipynb")) if p.name not in names]
    return stale


def exercises_of(nb) -> list[dict]:
    """The ``{"exercise": ..., "answer": ...}`` entries of a notebook's metadata."""
    meta = nb.metadata.get("simlib", [])
    return [meta] if isinstance(meta, dict) else list(meta)


def load_answers(path: Path | str) -> dict:
    """Run only the cells that hold solution regions (or their stubs) and return their namespace.

    Tests use it to grade a solution notebook (every check must pass) and the generated exercise (every
    check must say "not implemented yet") without starting the notebook's kernel.
    """
    nb = nbformat.read(str(path), as_version=4)
    namespace: dict = {"__name__": "__answers__"}
    for cell in nb.cells:
        if cell.cell_type == "code" and (BEGIN in cell.source or STUB[1] in cell.source):
            exec(compile(cell.source, f"{Path(path).name}", "exec"), namespace)  # noqa: S102 - our notebooks
    return namespace


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simlib.exercises", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if an exercise is stale (for CI)")
    parser.add_argument("--solutions", default=str(ROOT / "solutions"))
    parser.add_argument("--exercises", default=str(ROOT / "exercises"))
    args = parser.parse_args(argv)
    try:
        stale = generate(args.solutions, args.exercises, check=args.check)
    except MarkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if stale:
            print("stale exercises (run `python -m simlib.exercises` and commit):\n  " + "\n  ".join(stale))
            return 1
        print("exercises are up to date")
        return 0
    print("wrote " + (", ".join(stale) if stale else "nothing (all up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
