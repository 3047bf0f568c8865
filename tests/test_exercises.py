"""The exercise generator: committed exercises are up to date; markers become stubs; bad markers are refused."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from simlib import exercises as X

ROOT = Path(__file__).resolve().parent.parent


def test_committed_exercises_are_not_stale():
    stale = X.generate(ROOT / "solutions", ROOT / "exercises", check=True)
    assert not stale, f"regenerate with `python -m simlib.exercises` and commit: {stale}"


def test_every_solution_names_its_exercise():
    from simlib import grading

    for path in sorted((ROOT / "solutions").glob("[0-9]*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        entries = X.exercises_of(nb)
        assert entries, f"{path.name}: metadata.simlib missing"
        names = X.load_answers(path)
        for entry in entries:
            assert entry["exercise"] in grading.EXERCISES
            assert entry["answer"] in names
        assert nb.cells[0].cell_type == "markdown" and "Time" in nb.cells[0].source
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit without outputs"


def test_strip_keeps_indentation_and_the_code_around():
    src = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n\nprint(f)"
    out, regions = X.strip_solutions(src)
    assert regions == 1
    assert out == "def f(x):\n    y = 1\n    # YOUR CODE HERE\n    raise NotImplementedError()\n\nprint(f)"
    md, _ = X.strip_solutions("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "markdown")
    assert md == "Why?\nYOUR ANSWER HERE"


@pytest.mark.parametrize(
    "src",
    [
        "### BEGIN SOLUTION\nx = 1",
        "x = 1\n### END SOLUTION",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION",
    ],
)
def test_unbalanced_markers_are_refused(src):
    with pytest.raises(X.MarkerError):
        X.strip_solutions(src)


def _solution(tmp_path, body="    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"):
    nb = new_notebook(cells=[new_markdown_cell("# Ex\n\nTime: 1 s"), new_code_cell("def f():\n" + body)])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="solved")]
    nb.cells[1].execution_count = 3
    (tmp_path / "solutions").mkdir()
    nbformat.write(nb, str(tmp_path / "solutions" / "09_demo.ipynb"))
    return nb


def test_generate_check_and_cli(tmp_path):
    _solution(tmp_path)
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    assert X.generate(sol, ex, check=True) == ["09_demo.ipynb"]  # missing: stale
    assert X.generate(sol, ex) == ["09_demo.ipynb"]
    assert X.generate(sol, ex, check=True) == []
    nb = nbformat.read(str(ex / "09_demo.ipynb"), as_version=4)
    assert "raise NotImplementedError()" in nb.cells[1].source and "return 1" not in nb.cells[1].source
    assert nb.cells[1].outputs == [] and nb.cells[1].execution_count is None
    assert "Generated from `solutions/09_demo.ipynb`" in nb.cells[0].source
    with pytest.raises(NotImplementedError):
        X.load_answers(ex / "09_demo.ipynb")["f"]()
    assert X.load_answers(sol / "09_demo.ipynb")["f"]() == 1
    cli = [sys.executable, "-m", "simlib.exercises", "--solutions", str(sol), "--exercises", str(ex), "--check"]
    assert subprocess.run(cli, capture_output=True).returncode == 0
    (ex / "09_demo.ipynb").write_text((ex / "09_demo.ipynb").read_text().replace("YOUR CODE", "MY CODE"))
    result = subprocess.run(cli, capture_output=True, text=True)
    assert result.returncode == 1 and "09_demo.ipynb" in result.stdout
    (ex / "10_orphan.ipynb").write_text((ex / "09_demo.ipynb").read_text())
    assert "10_orphan.ipynb (no solution)" in X.generate(sol, ex, check=True)


def test_a_solution_without_markers_is_refused(tmp_path):
    _solution(tmp_path, body="    return 1")
    with pytest.raises(X.MarkerError, match="no '### BEGIN SOLUTION'"):
        X.generate(tmp_path / "solutions", tmp_path / "exercises")
