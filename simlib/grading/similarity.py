"""How close a submission's code is to the library's own reference code: a note for the teacher, never a failure.

The library is open, so a learner can read and type in its code; refusing such an answer is out of scope (issue
47), and the old refusal (exact bytecode) was beaten by one no-op line anyway. ``simlib grade`` instead compares the
structure of each function the submission's cells define with the library's functions that solve the same
exercise (:data:`REFERENCES`): both are parsed (``ast``), docstrings dropped and every local name, argument and
function name replaced by its order of first use, so renaming, comments, blank lines, docstrings and no-op lines
change nothing; the two normalised trees are compared node by node (``difflib``'s ratio over the node sequence).
A close match (:data:`CLOSE`, 0.9) becomes a ``note`` row in the class report, beside the checks, not among them.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import textwrap

CLOSE = 0.9

# exercise -> the library's functions (module:qualified name) that do what the exercise asks
REFERENCES = {
    "ring_all_reduce": [
        "simlib.collectives:ring_all_reduce",
        "simlib.collectives:ring_reduce_scatter_",
        "simlib.collectives:ring_all_gather_",
    ],
    "full_state": ["simlib.train:TrainState.state_dict", "simlib.train:TrainState.load_state_dict"],
}


class _Rename(ast.NodeTransformer):
    """Every identifier the code binds or reads as a plain name becomes ``v0``, ``v1``, ... in order of first use;
    attribute names (the APIs it calls) stay. Docstrings and ``pass`` statements go."""

    def __init__(self):
        self.names: dict = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = self._name(node.arg), None
        return node

    def _body(self, node):
        body = [s for s in node.body if not isinstance(s, ast.Pass)]
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]  # the docstring
        node.body = body or [ast.Pass()]

    def visit_FunctionDef(self, node):
        node.name, node.returns, node.decorator_list = self._name(node.name), None, []
        self._body(node)
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def normalised(source: str) -> list[str]:
    """The node sequence of ``source``'s normalised syntax tree (types and kept names), for comparison."""
    tree = _Rename().visit(ast.parse(textwrap.dedent(source)))
    out = []
    for node in ast.walk(tree):
        label = type(node).__name__
        for field in ("id", "attr", "arg", "name", "value", "op"):
            v = getattr(node, field, None)
            if isinstance(v, (str, int, float, bool)) or v is None and field == "value" and label == "Constant":
                label += f":{v!r}"
            elif isinstance(v, ast.AST) and field == "op":
                label += f":{type(v).__name__}"
        out.append(label)
    return out


def similarity(a: str, b: str) -> float:
    """1.0 for the same structure, lower the more the two pieces of code differ."""
    x, y = normalised(a), normalised(b)
    return difflib.SequenceMatcher(None, x, y, autojunk=False).ratio()


def _reference_source(spec: str) -> tuple[str, str]:
    module, qualname = spec.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return qualname, inspect.getsource(obj)


def functions_in(source: str) -> dict:
    """{qualified name: source} of every function the cell's code defines (methods as Class.method)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found = {}

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = ast.get_source_segment(source, child) or ""
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree)
    return found


def library_matches(exercise: str, source: str, close: float = CLOSE) -> list[tuple[str, str, float]]:
    """(the submission's function, the library's, similarity) for each pair at least ``close`` alike."""
    refs = []
    for spec in REFERENCES.get(exercise, []):
        try:
            refs.append(_reference_source(spec))
        except (ImportError, AttributeError, OSError, TypeError):
            continue
    out = []
    for name, code in functions_in(source).items():
        if len(normalised(code)) < 20:  # a one-liner matches anything; nothing to note
            continue
        best = max(((ref, similarity(code, ref_code)) for ref, ref_code in refs), key=lambda t: t[1], default=None)
        if best and best[1] >= close:
            out.append((name, best[0], round(best[1], 3)))
    return out
