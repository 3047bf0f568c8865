"""The library's shape, checked: no file over 500 lines, no modules that import each other in a circle.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of a simlib
module, at module level *and* inside functions (a function-level import hides a circle from Python, not from a
reader). ``from . import x`` counts as an import of the submodule ``x`` when there is one, else of the package.
A module that takes the package object to hand to a learner's namespace (``importlib.import_module``) is not an
import the graph sees; CONTRIBUTING says where each layer may import from.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simlib"
MAX_LINES = 500


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return mods


def import_graph() -> dict[str, set[str]]:
    """simlib module -> the simlib modules it imports (anywhere in its source)."""
    mods = _modules()
    graph = {}
    for name, (path, is_init) in mods.items():
        here = name.split(".") if is_init else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_file_in_simlib_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, (f"files over {MAX_LINES} lines: {long}; split each along a seam a reader would expect "
                      "(CONTRIBUTING's layout) and re-export what others import")


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, "modules that import each other in a circle (move the shared piece below both): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle():
    """The check above can fail: a planted circle (a -> b -> c -> a) and a self-contained one are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "simlib.launch" in graph["simlib"] and "simlib.grading.core" in graph["simlib.grading.memory"]
