"""Every claim a notebook makes is checked by the run that makes it.

A claim is an ``assert`` in the cell that measures it (CONTRIBUTING, "The lesson template"). These tests hold
the mechanism to that: a notebook whose assertion fails makes ``pytest`` fail (nbval, the way the suite runs
notebooks), and no notebook carries a ``# NBVAL_CHECK_OUTPUT`` cell without stored output (notebooks are
committed without outputs, so such a cell would compare nothing and pass whatever it printed).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"), *ROOT.glob("exercises/*.ipynb")])

# A claim as lessons write it: summation order changes a sum in its last bits, so equality is "within a
# tolerance". (0.1 + 0.2) + 0.3 and 0.1 + (0.2 + 0.3) differ by one ulp in float64: with a tolerance of 0 the
# claim is false, and the run must say so by failing.
CLAIM = """import math
a, b = (0.1 + 0.2) + 0.3, 0.1 + (0.2 + 0.3)
TOL = {tol}
print(f"difference {{abs(a - b):.1e}} (tolerance {{TOL:g}})")
assert math.isclose(a, b, rel_tol=0, abs_tol=TOL), f"the sums differ by {{abs(a - b):.1e}} > {{TOL:g}}"
"""


def test_no_notebook_has_an_output_check_that_compares_nothing():
    unchecked = []
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if (
                cell["cell_type"] == "code"
                and "NBVAL_CHECK_OUTPUT" in "".join(cell["source"])
                and not cell.get("outputs")
            ):
                unchecked.append(f"{path.relative_to(ROOT)} cell {i}")
    assert not unchecked, (
        "# NBVAL_CHECK_OUTPUT on a cell without stored output checks nothing; turn its "
        f"claim into an assert in the cell: {unchecked}"
    )


def test_a_broken_claim_fails_the_test_run(tmp_path):
    """The suite's own notebook runner (nbval, --nbval-lax) fails on a notebook whose claim does not hold."""
    for name, tol in (("holds.ipynb", 1e-12), ("broken.ipynb", 0)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CLAIM.format(tol=tol))])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the course's settings: only these two notebooks
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            "--nbval-current-env",
            "holds.ipynb",
            "broken.ipynb",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "broken.ipynb" in out and "the sums differ by 1.1e-16 > 0" in out, out


def test_the_grader_starts_kernels_without_the_tcp_warning(tmp_path, capfd):
    """`simlib grade` runs each notebook in its own kernel; none may print "Kernel is running over TCP"."""
    from simlib.grading import batch

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("answer = 6 * 7")])
    result = batch._execute(nb, ["answer"], 120, "python3", tmp_path)
    assert result["status"] == "pass", result
    assert "without encryption" not in capfd.readouterr().err


def test_the_quick_gpt_target_is_below_the_unigram_baseline():
    """Reaching project 1's quick target must mean the model learned something about context."""
    from simlib.projects.gpt import run as project_gpt
    from simlib.projects.gpt import text

    assert project_gpt.settings(True)["target"]["eval_loss"] < text.unigram_cross_entropy()
    assert project_gpt.settings(False)["target"]["eval_loss"] < text.unigram_cross_entropy()
