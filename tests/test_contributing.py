"""CONTRIBUTING's recipes stay true (issue 34): every file, folder and ``simlib.*`` name it spells exists, and every
module of ``simlib/parallel/`` and ``simlib/lessons/`` is listed in its "Where things live" table."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CONTRIBUTING.md").read_text()
SIMLIB = ROOT / "simlib"
# where a short name in the text may live (a table row names `zero.py` for simlib/parallel/zero.py)
BASES = [ROOT, ROOT / "tests", ROOT / "benchmarks", SIMLIB] + sorted(
    p for p in SIMLIB.rglob("*") if p.is_dir() and "__pycache__" not in p.parts
)
PLACEHOLDERS = ("tests/test_x.py",)  # "run only what you touched: tests/test_x.py"
GENERATED = (
    "results/",
    "grades/",
    "submissions/",
    "grades.csv",
    "grades.json",
    "grades_summary.csv",
    "grades.rows.jsonl",
    "config.toml",
    "summary.json",
    "run.jsonl",
    "final_model.pt",
)  # written by runs


def _spans() -> list[str]:
    return re.findall(r"`([^`\n]+)`", TEXT)


def _paths() -> set[str]:
    out = set()
    for span in _spans():
        for token in re.split(r"[\s(),]+", span):
            token = token.rstrip(".:;'\"").lstrip("'\"")
            if not token or any(c in token for c in "<>*…{}=[]") or "NN_" in token or token.startswith(("-", "$", "/")):
                continue
            if token.endswith((".py", ".ipynb", ".md", ".toml", ".yml", ".json")) or (
                "/" in token and not token.startswith(("http", "/"))
            ):
                out.add(token)
    return out


def _exists(token: str) -> bool:
    """A path, or ``path/module.attribute`` (``lessons/memory.run_memory``): the module holds the name."""
    if any((base / token.rstrip("/")).exists() for base in BASES):
        return True
    path, _, attr = token.rpartition(".")
    return bool(attr.isidentifier() and path) and any(
        (base / f"{path}.py").exists() and re.search(rf"\b{attr}\b", (base / f"{path}.py").read_text())
        for base in BASES
    )


def test_every_file_a_recipe_names_exists():
    missing = sorted(
        p for p in _paths() if not p.startswith(GENERATED) and p not in GENERATED + PLACEHOLDERS and not _exists(p)
    )
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"


def test_every_simlib_name_a_recipe_uses_exists():
    missing = []
    for name in sorted({m for span in _spans() for m in re.findall(r"\bsimlib(?:\.\w+)+", span)}):
        parts = name.split(".")
        for k in range(len(parts), 0, -1):  # the longest prefix that is a module, then its attributes by name
            base = ROOT.joinpath(*parts[:k])
            module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if module.exists():
                source = module.read_text()
                if not all(re.search(rf"\b{re.escape(attr)}\b", source) for attr in parts[k:]):
                    missing.append(name)
                break
        else:
            missing.append(name)
    assert not missing, f"CONTRIBUTING.md names simlib modules or functions that do not exist: {missing}"


def _row(folder: str) -> str:
    rows = [line for line in TEXT.splitlines() if line.startswith(f"| `{folder}` |")]
    assert rows, f"no row for {folder} in CONTRIBUTING's 'Where things live' table"
    return rows[0]


def test_every_parallel_and_lessons_module_is_listed():
    parallel, lessons = _row("simlib/parallel/"), _row("simlib/lessons/")
    unlisted = [
        f"parallel/{p.name}"
        for p in sorted((SIMLIB / "parallel").glob("*.py"))
        if p.stem != "__init__" and f"`{p.name}`" not in parallel
    ]
    unlisted += [
        f"lessons/{p.name}"
        for p in sorted((SIMLIB / "lessons").glob("*.py"))
        if p.stem != "__init__" and f"`{p.stem}`" not in lessons
    ]
    assert not unlisted, f"modules CONTRIBUTING.md's table does not list: {unlisted}"


def test_the_checks_can_fail(monkeypatch):
    """A recipe naming a file that is gone, and a module missing from the table, are caught."""
    global TEXT
    saved = TEXT
    try:
        TEXT = saved + "\nsee `simlib/parallel/gone.py` and `simlib.train.no_such_function`\n"
        assert "simlib/parallel/gone.py" in _paths()
        TEXT = saved.replace("`dims.py`, ", "").replace("`dims.py`", "")
        try:
            test_every_parallel_and_lessons_module_is_listed()
        except AssertionError as exc:
            assert "parallel/dims.py" in str(exc)
        else:
            raise AssertionError("a module missing from the table was not caught")
    finally:
        TEXT = saved
