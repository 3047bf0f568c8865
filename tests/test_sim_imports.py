"""simlib.sim has no import circles: every module's imports of its siblings (module-level or inside a function)
form a graph without a cycle, so the formulas each live in one place that the others import."""

import ast
import pathlib

import simlib.sim

SIM = pathlib.Path(simlib.sim.__file__).parent


def sibling_imports():
    mods = {p.stem: p for p in SIM.glob("*.py")}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[name] = deps & set(mods) - {"__init__"}
    return graph


def test_no_import_cycle_inside_sim():
    graph = sibling_imports()
    state = {}

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph[node]):
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(path + [dep])
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # the formulas are imported, not defined twice: topology and layer no longer import cost
    assert "cost" not in graph["topology"] and "cost" not in graph["layer"]
    assert "calibrate" not in graph["hardware"]
