"""The library's shape, checked: no file over 500 lines, no modules that import each other in a circle.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of a simlib
module, at module level *and* inside functions (a function-level import hides a circle from Python, not from a
reader). ``from . import x`` counts as an import of the submodule ``x`` when there is one, else of the package.
Dynamic imports count too: ``importlib.import_module(name[, package])`` and ``__import__(name)`` with a constant
name (absolute or relative), ``__package__`` (the package) or ``__name__``; with a computed name, every simlib
module the file names in a string constant (a registry's ``"simlib.projects.gpt.run"``) is taken as imported.
CONTRIBUTING says where each layer may import from.
"""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simlib"
MAX_LINES = 500


def _modules(package: pathlib.Path = PACKAGE) -> dict[str, tuple[pathlib.Path, bool]]:
    mods = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return mods


def _resolve(name: str, package: str) -> str:
    """``importlib.import_module``'s resolution of a relative name (``.launch``, ``..train``) in ``package``."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def _dynamic_targets(node: ast.Call, name: str, package: str, literals: set[str]) -> set[str]:
    """What an ``import_module``/``__import__`` call imports: its constant name resolved, else every literal."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called not in ("import_module", "__import__") or not node.args:
        return set()
    arg = node.args[0]
    anchor = package
    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        anchor = node.args[1].value
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {_resolve(arg.value, anchor)}
    if isinstance(arg, ast.Name) and arg.id in ("__package__", "__name__"):
        return {package if arg.id == "__package__" else name}
    return set(literals)  # computed: whatever simlib module the file names may be the one


@functools.lru_cache(maxsize=4)  # read once per folder: several tests ask (read-only: nobody changes the result)
def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (anywhere in its source, in any form)."""
    mods = _modules(package)
    graph = {}
    for name, (path, is_init) in mods.items():
        here = name.split(".") if is_init else name.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        literals = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in mods
        }
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Call):
                deps.update(_dynamic_targets(node, name, ".".join(here), literals))
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


def test_no_file_in_simlib_or_benchmarks_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for folder in (PACKAGE, ROOT / "benchmarks")
        for p in folder.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, (
        f"files over {MAX_LINES} lines: {long}; split each along a seam a reader would expect "
        "(CONTRIBUTING's layout) and re-export what others import"
    )


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, "modules that import each other in a circle (move the shared piece below both): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_circle_finder_finds_a_circle():
    """The check above can fail: a planted circle (a -> b -> c -> a) and a self-contained one are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "simlib.launch" in graph["simlib"] and "simlib.grading.core" in graph["simlib.grading.memory"]
    assert "simlib.projects.gpt.run" in graph["simlib.projects.registry"]  # a registry's computed import


def test_circles_through_dynamic_imports_are_found(tmp_path):
    """A package imported back by ``importlib.import_module(__package__)`` (simlib <-> magic until issue 34), by a
    relative constant name, by ``__import__``, or by a name computed from the module names a file spells."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {
        "__init__.py": "def load():\n    from . import magic\n",
        "magic.py": "import importlib\ndef ns():\n    return importlib.import_module(__package__)\n",
        "a.py": "from importlib import import_module\ndef f():\n    return import_module('.b', __package__)\n",
        "b.py": "def g():\n    return __import__('pkg.a')\n",
        "reg.py": "import importlib\nMODS = {'x': 'pkg.run'}\ndef get(k):\n    return importlib.import_module(MODS[k])\n",
        "run.py": "def h():\n    from .reg import MODS\n",
        "alone.py": "import importlib\ndef f(name):\n    return importlib.import_module(name)\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert sorted(cycles(graph)) == [["pkg", "pkg.magic"], ["pkg.a", "pkg.b"], ["pkg.reg", "pkg.run"]], graph
    assert graph["pkg.alone"] == set()


def test_building_blocks_do_not_import_the_layers_above():
    """``simlib/parallel/`` holds what ``parallelize`` composes: blocks with explicit arguments. None imports the
    trainer, the plan, ``parallelize`` or anything that drives them (step_memory is a hook the loop calls)."""
    above = (
        "simlib.train",
        "simlib.plan",
        "simlib.parallelize",
        "simlib.projects",
        "simlib.lessons",
        "simlib.grading",
        "simlib.debug",
        "simlib.cli",
        "simlib.widgets",
        "simlib.sim",
    )
    bad = {
        m: sorted(d for d in deps if d.startswith(above))
        for m, deps in import_graph().items()
        if m.startswith("simlib.parallel.")
    }
    assert not any(bad.values()), {m: d for m, d in bad.items() if d}


def group_of(module: str) -> str | None:
    """The unit a layer is made of: a subpackage (``simlib.debug``, ``simlib.sim``...) or a top-level module
    (``simlib.train``); None for the package root, which re-exports the top of every layer."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def group_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph collapsed onto :func:`group_of`: an edge between two groups when any module of one imports
    any module of the other."""
    groups: dict[str, set[str]] = {}
    for module, deps in graph.items():
        a = group_of(module)
        if a is None:
            continue
        groups.setdefault(a, set()).update(b for d in deps if (b := group_of(d)) not in (None, a))
    return groups


def test_no_circle_among_packages():
    """Layers point one way (issue 49): ``simlib.debug`` may use the trainer and the launcher, not the other way
    round (the core calls tools through ``simlib.hooks``); ``simlib.sim`` and the projects likewise."""
    graph = import_graph()
    found = cycles(group_graph(graph))
    edges = [
        f"{m} -> {d}"
        for c in found
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if group_of(m) in c and group_of(d) in c and group_of(m) != group_of(d)
    ]
    assert not found, f"packages that import each other in a circle: {found}; through {edges[:20]}"


def test_the_package_circle_finder_finds_one():
    graph = {"s.a.x": {"s.b"}, "s.b": {"s.a.y"}, "s.a.y": set(), "s.c": {"s.a.x"}}
    assert cycles(group_graph(graph)) == [["s.a", "s.b"]]


def private_imports(package: pathlib.Path = PACKAGE) -> list[str]:
    """Every use of another package's private name (``_x``) in the source: ``from other import _x`` and
    ``other_module._x`` on a module bound by an import. Within one package a module may use its siblings' ``_x``."""
    mods = _modules(package)

    def package_of(module: str) -> str:
        return module if mods.get(module, (None, True))[1] else module.rpartition(".")[0]

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    found = []
    for name, (path, _) in mods.items():
        here = package_of(name)
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # local name -> the simlib module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve("." * node.level + (node.module or ""), here) if node.level else node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                    elif target in mods and private(alias.name) and package_of(target) != here:
                        found.append(f"{name}: from {target} import {alias.name}")
            elif isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                target = bound[node.value.id]
                if private(node.attr) and package_of(target) != here:
                    found.append(f"{name}: {node.value.id}.{node.attr} ({target})")
    return sorted(set(found))


def test_no_package_uses_another_packages_private_names():
    """A name with a leading underscore is its package's own: another package that needs it asks for a public name."""
    found = private_imports()
    assert not found, "private names used across packages (make them public where they are defined): " + "; ".join(
        found
    )


def test_the_private_name_finder_finds_them(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "def _x():\n    pass\n",
        "b.py": "from .a import _x\n",  # a sibling's: allowed
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import _x\nfrom .. import a\na._x()\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert private_imports(pkg) == ["pkg.sub.c: a._x (pkg.a)", "pkg.sub.c: from pkg.a import _x"]
