"""Mutants of a solution's answer, made with :mod:`ast`: the measure of how many wrong answers the grader catches.

:func:`answer_cells` reads a solution notebook's cells that hold nbgrader regions (``### BEGIN SOLUTION`` ..
``### END SOLUTION``); :func:`mutate` makes every single-point mutant of the code *inside* those regions (the
skeleton around them is the exercise's, not the learner's):

==============  =====================================================================================
operator        what it changes
==============  =====================================================================================
``arith``       ``+ - * / // % @ **`` swapped for a neighbour (also in ``+=`` etc.)
``compare``     ``<`` for ``<=``, ``==`` for ``!=``, ``is`` for ``is not``, ``in`` for ``not in``, ...
``constant``    an integer ``c`` to ``c + 1``, ``c - 1``, ``2 c``; a float to ``2 c``; ``True``/``False`` flipped
``delete``      one statement replaced by ``pass``
``swap_args``   the first two positional arguments of a call swapped
``off_by_one``  a ``range`` stop, a slice bound or a computed index moved by one
``collective``  a collective replaced by a cheaper one (``broadcast`` from rank 0, ``reduce`` to rank 0) or by
                nothing (its tensor left as it is)
``detach``      ``.detach()`` or ``.clone()`` dropped
``max_shift``   ``x - x.max(...)`` (the softmax's stability shift) replaced by ``x``
==============  =====================================================================================

Mutants whose source is the same as another's (or as the solution's) are dropped. Whether a mutant is
*equivalent* (behaves like the solution) cannot be decided from the source: ``benchmarks/grader_mutation.py``
decides it per exercise, on random instances against the reference.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

import nbformat

from ..exercises import BEGIN, END

_ARITH = {
    ast.Add: [ast.Sub],
    ast.Sub: [ast.Add],
    ast.Mult: [ast.Div, ast.Add],
    ast.Div: [ast.Mult, ast.FloorDiv],
    ast.FloorDiv: [ast.Div, ast.Mult],
    ast.Mod: [ast.FloorDiv],
    ast.MatMult: [ast.Mult],
    ast.Pow: [ast.Mult],
}
_COMPARE = {
    ast.Lt: [ast.LtE, ast.Gt],
    ast.LtE: [ast.Lt],
    ast.Gt: [ast.GtE, ast.Lt],
    ast.GtE: [ast.Gt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}
_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.MatMult: "@",
    ast.Pow: "**",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "broadcast",
    "gather",
    "scatter",
}


@dataclass
class Mutant:
    """One mutant: ``sources`` are the answer cells' code with the change, ``where`` the solution's line."""

    id: int
    operator: str
    description: str
    cell: int
    line: int
    sources: list

    def to_dict(self) -> dict:
        return dict(id=self.id, operator=self.operator, line=self.line, cell=self.cell, mutation=self.description)


def answer_cells(path) -> list[tuple[str, list[tuple[int, int]]]]:
    """(source, [(first line, last line) of each solution region]) of each code cell that holds a region."""
    nb = nbformat.read(str(path), as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code" or BEGIN not in cell.source:
            continue
        regions, start = [], None
        for number, line in enumerate(cell.source.splitlines(), 1):
            if line.strip() == BEGIN:
                start = number
            elif line.strip() == END and start is not None:
                regions.append((start, number))
                start = None
        cells.append((cell.source, regions))
    return cells


def _inside(node, regions) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and any(a < line < b for a, b in regions)


def _plus(node, k: int):
    return ast.BinOp(left=node, op=ast.Add() if k > 0 else ast.Sub(), right=ast.Constant(abs(k)))


def _segment(source: str, node) -> str:
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _edits(node, parent_field, source):
    """(operator, description, edit) for every mutation of ``node``; ``edit(copy_of_node)`` returns its
    replacement (a node, or None to delete a statement). ``parent_field`` tells how it sits in its parent."""
    out = []
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        for op in _ARITH.get(type(node.op), []):
            out.append(
                (
                    "arith",
                    f"`{_SYMBOL[type(node.op)]}` -> `{_SYMBOL[op]}`",
                    lambda n, op=op: (setattr(n, "op", op()), n)[1],
                )
            )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_max(node.right):
        out.append(("max_shift", f"`{_segment(source, node)}` -> its left side (no max subtracted)", lambda n: n.left))
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for new in _COMPARE.get(type(op), []):
                out.append(
                    (
                        "compare",
                        f"`{_SYMBOL[type(op)]}` -> `{_SYMBOL[new]}`",
                        lambda n, i=i, new=new: (n.ops.__setitem__(i, new()), n)[1],
                    )
                )
    if isinstance(node, ast.Constant) and parent_field != "docstring":
        v = node.value
        if isinstance(v, bool):
            out.append(("constant", f"`{v}` -> `{not v}`", lambda n: ast.Constant(not n.value)))
        elif isinstance(v, int):
            for new in sorted({v + 1, v - 1, 2 * v} - {v}):
                out.append(("constant", f"`{v}` -> `{new}`", lambda n, new=new: ast.Constant(new)))
        elif isinstance(v, float):
            for new in sorted({2 * v, v + 1} - {v}):
                out.append(("constant", f"`{v!r}` -> `{new!r}`", lambda n, new=new: ast.Constant(new)))
    if isinstance(node, ast.Call):
        args = node.args
        if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
            out.append(
                (
                    "swap_args",
                    f"`{_segment(source, node)}`: first two arguments swapped",
                    lambda n: (n.args.__setitem__(slice(0, 2), [n.args[1], n.args[0]]), n)[1],
                )
            )
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "range" and args:
            stop = 0 if len(args) == 1 else 1
            for k in (1, -1):
                out.append(
                    (
                        "off_by_one",
                        f"`{_segment(source, node)}`: stop {'+' if k > 0 else '-'} 1",
                        lambda n, k=k, stop=stop: (n.args.__setitem__(stop, _plus(n.args[stop], k)), n)[1],
                    )
                )
            if len(args) >= 2:
                out.append(
                    (
                        "off_by_one",
                        f"`{_segment(source, node)}`: start + 1",
                        lambda n: (n.args.__setitem__(0, _plus(n.args[0], 1)), n)[1],
                    )
                )
        if name in COLLECTIVES and isinstance(node.func, ast.Attribute) and args:
            for cheaper, key in (("broadcast", "src"), ("reduce", "dst")):
                if cheaper != name:
                    out.append(
                        (
                            "collective",
                            f"`{name}` -> `{cheaper}` ({key}=0)",
                            lambda n, cheaper=cheaper, key=key: ast.Call(
                                func=ast.Attribute(value=n.func.value, attr=cheaper, ctx=ast.Load()),
                                args=[n.args[0]],
                                keywords=[ast.keyword(arg=key, value=ast.Constant(0))],
                            ),
                        )
                    )
            out.append(("collective", f"`{name}` dropped (its tensor left as it is)", lambda n: ast.Constant(None)))
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("detach", "clone") and not args:
            out.append(("detach", f"`.{node.func.attr}()` dropped", lambda n: n.func.value))
    if isinstance(node, ast.Slice):
        for bound in ("lower", "upper"):
            if getattr(node, bound) is not None:
                for k in (1, -1):
                    out.append(
                        (
                            "off_by_one",
                            f"slice {bound} bound `{_segment(source, getattr(node, bound))}` {'+' if k > 0 else '-'} 1",
                            lambda n, b=bound, k=k: (setattr(n, b, _plus(getattr(n, b), k)), n)[1],
                        )
                    )
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, (ast.Slice, ast.Constant, ast.Tuple)):
        out.append(
            (
                "off_by_one",
                f"index `{_segment(source, node.slice)}` + 1",
                lambda n: (setattr(n, "slice", _plus(n.slice, 1)), n)[1],
            )
        )
    if (
        isinstance(node, ast.stmt)
        and parent_field == "body"
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ):
        out.append(("delete", f"statement `{_segment(source, node).splitlines()[0]}` deleted", lambda n: None))
    return out


def _is_max(node) -> bool:
    """``x.max(...)``, ``x.max(...).values``, ``x.amax(...)``, ``torch.max(x, ...)[0]``, a name holding ``max``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)) and not (
        isinstance(node, ast.Attribute) and node.attr in ("max", "amax")
    ):
        node = node.value
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr in ("max", "amax")) or (
        isinstance(node, ast.Name) and "max" in node.id.lower()
    )


def _sites(tree, regions):
    """(path to the node, the field it sits in) for every node inside a region, in a stable order."""
    found = []

    def walk(node, path, field):
        if _inside(node, regions):
            found.append((path, field))
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        kind = "body" if isinstance(child, ast.stmt) else name
                        if (
                            i == 0
                            and isinstance(child, ast.Expr)
                            and isinstance(getattr(child, "value", None), ast.Constant)
                        ):
                            kind = "docstring"
                        walk(child, path + ((name, i),), kind)
            elif isinstance(value, ast.AST):
                walk(value, path + ((name, None),), name)

    walk(tree, (), "module")
    return found


def _get(tree, path):
    node = tree
    for name, i in path:
        node = getattr(node, name) if i is None else getattr(node, name)[i]
    return node


def _replace(tree, path, new) -> None:
    parent = _get(tree, path[:-1])
    name, i = path[-1]
    if i is None:
        setattr(parent, name, new)
    elif new is None:
        getattr(parent, name)[i] = ast.Pass()
    else:
        getattr(parent, name)[i] = new


def _unrelated(a, b) -> bool:
    """Two edits that can both be made: in different cells, or neither node inside the other."""
    return a[0] != b[0] or (a[1][: len(b[1])] != b[1] and b[1][: len(a[1])] != a[1])


def mutate(cells, at_least: int = 0, seed: int = 0) -> list[Mutant]:
    """Every single-point mutant of ``cells`` (from :func:`answer_cells`), duplicates and no-ops removed; when
    there are fewer than ``at_least`` (a short answer), second-order mutants (two changes on different lines,
    drawn with ``seed``; then three) are added until there are."""
    import random

    originals = [ast.unparse(ast.parse(src)) for src, _ in cells]
    trees = [ast.parse(src) for src, _ in cells]
    edits = []  # (cell, path, line, operator, description, edit)
    for c, (source, regions) in enumerate(cells):
        for path, field in _sites(trees[c], regions):
            node = _get(trees[c], path)
            for operator, description, edit in _edits(node, field, source):
                edits.append((c, path, node.lineno, operator, description, edit))
    seen, mutants = set(originals), []

    def make(chosen) -> None:
        new_trees = {c: copy.deepcopy(trees[c]) for c in {e[0] for e in chosen}}
        try:
            for c, path, _, _, _, edit in sorted(chosen, key=lambda e: -len(e[1])):  # deepest first
                _replace(new_trees[c], path, edit(_get(new_trees[c], path)))
            texts = [
                ast.unparse(ast.fix_missing_locations(new_trees[c])) if c in new_trees else originals[c]
                for c in range(len(cells))
            ]
        except (AttributeError, TypeError, ValueError, IndexError):
            return
        key = "\n#cell\n".join(texts)
        if key in seen:
            return
        seen.add(key)
        mutants.append(
            Mutant(
                len(mutants),
                "+".join(e[3] for e in chosen),
                "; ".join(f"line {e[2]}: {e[4]}" for e in chosen),
                chosen[0][0],
                chosen[0][2],
                texts,
            )
        )

    for e in edits:
        make([e])
    rng, tries = random.Random(seed), 0
    while len(mutants) < at_least and len(edits) >= 2 and tries < 50 * at_least:
        tries += 1
        chosen = rng.sample(edits, min(len(edits), 2 if tries < 25 * at_least else 3))  # then third order
        lines = {(e[0], e[2]) for e in chosen}
        if len(lines) == len(chosen) and all(_unrelated(a, b) for a in chosen for b in chosen if a is not b):
            make(sorted(chosen, key=lambda e: (e[0], e[2])))
    return mutants


def load(sources: list[str], name: str) -> dict:
    """Run the (mutated) answer cells as :func:`simlib.exercises.load_answers` runs a solution's."""
    namespace: dict = {"__name__": "__answers__"}
    for i, src in enumerate(sources):
        exec(compile(src, f"<{name} cell {i}>", "exec"), namespace)  # noqa: S102 - the course's own solutions
    return namespace
