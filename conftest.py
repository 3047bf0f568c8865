"""Root pytest configuration: quick mode for the tests and for the notebook kernels nbval starts.

Notebooks 07, 08, 10, 11 and 12 are run once, not twice: in the browser (tests/test_browser.py, Run All in
JupyterLab, their claims asserted in their cells and checked on the page) when Chromium and Playwright are
there, otherwise under nbval with the rest. ``SIMLIB_NBVAL_ALL=1`` runs them under nbval anyway; naming one on
the command line (``pytest notebooks/07_memory.ipynb``) always runs it.
"""
import importlib.util
import os
import shutil
from pathlib import Path

os.environ.setdefault("SIMLIB_QUICK", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parent
IN_BROWSER = {ROOT / "notebooks" / name for name in ("07_memory.ipynb", "08_fault_tolerance.ipynb",
                                                     "10_project_gpt.ipynb", "11_project_vision.ipynb",
                                                     "12_project_finance.ipynb")}


def _browser_runs_them() -> bool:
    return (os.environ.get("SIMLIB_NBVAL_ALL", "0") in ("", "0") and importlib.util.find_spec("playwright") is not None
            and (shutil.which("chromium") or shutil.which("chromium-browser")) is not None)


def pytest_ignore_collect(collection_path, config):
    if collection_path in IN_BROWSER and _browser_runs_them():
        named = {Path(str(a).split("::")[0]).resolve() for a in config.args}
        return collection_path not in named or None
    return None
