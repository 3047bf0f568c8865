"""Root pytest configuration: quick mode for the tests and for the notebook kernels nbval starts.

Notebooks 00, 07 and 08 are run once, not twice: in the browser (tests/test_browser.py, Run All in JupyterLab,
their claims asserted in their cells and checked on the page, their explorers moved) when Chromium and Playwright
are there, otherwise under nbval with the rest. The projects' notebooks (10-12) have no explorer a browser would
show: nbval runs them (their claims are asserts in their cells), at less CPU than JupyterLab and Chromium take. ``SIMLIB_NBVAL_ALL=1`` runs them under nbval anyway; naming one on
the command line (``pytest notebooks/07_memory.ipynb``) always runs it.
"""

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("SIMLIB_QUICK", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parent
IN_BROWSER = {
    ROOT / "notebooks" / name
    for name in (
        "00_getting_started.ipynb",
        "07_memory.ipynb",
        "08_fault_tolerance.ipynb",
    )
}


def _browser_runs_them() -> bool:
    return (
        os.environ.get("SIMLIB_NBVAL_ALL", "0") in ("", "0")
        and importlib.util.find_spec("playwright") is not None
        and (shutil.which("chromium") or shutil.which("chromium-browser")) is not None
    )


def pytest_ignore_collect(collection_path, config):
    if collection_path in IN_BROWSER and _browser_runs_them():
        named = {Path(str(a).split("::")[0]).resolve() for a in config.args}
        return collection_path not in named or None
    return None


# --- The solutions' checks, graded once: strictly, in the notebook's own run ----------------------------------------
# A kernel that runs a solutions/ notebook starts with SIMLIB_GRADE_STRICT=1 (simlib.grading.core._strict): its
# check cells then raise unless the solution passes every check on 2, 3 and 4 ranks, so nbval's run asserts what
# tests/test_grading.py::test_solution_passes_every_check asserts, and that test is left out for a notebook nbval
# runs in the same session (the solution is not graded twice). Named on the command line, it always runs.
SOLUTIONS = ROOT / "solutions"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a notebook's kernel starts (the setup of its first cell): strict grading for solutions/ only."""
    from simlib.grading.core import STRICT

    if Path(str(item.fspath)).parent == SOLUTIONS:
        os.environ[STRICT] = "1"
    else:
        os.environ.pop(STRICT, None)


# The solution notebook that tests/test_busy_machine.py runs under nbval beside a CPU burner (strict grading, as
# nbval runs it here, at 4x the cores' load): in a session that runs that test, nbval does not run it a second
# time on a quiet machine (the burner's run asserts everything the quiet one does). Named, it always runs.
BESIDE_A_BURNER = SOLUTIONS / "02_average_gradients.ipynb"
BURNER_TEST = "tests/test_busy_machine.py::test_a_solution_notebook_passes_beside_a_cpu_burner"


def _burner_runs_it(config, items) -> bool:
    named = {Path(str(a).split("::")[0]).resolve() for a in config.args}
    on_linux = os.path.exists("/proc/loadavg")  # the burner reads the load there (the test skips without it)
    return on_linux and BESIDE_A_BURNER not in named and any(i.nodeid == BURNER_TEST for i in items)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    # graded strictly in this session: by nbval, or (the burner's notebook) by the busy-machine test's nbval run
    by_nbval = {Path(str(i.fspath)).stem for i in items if Path(str(i.fspath)).parent == SOLUTIONS}
    if _burner_runs_it(config, items):
        twice = [i for i in items if Path(str(i.fspath)) == BESIDE_A_BURNER]
        if twice:
            config.hook.pytest_deselected(items=twice)
            items[:] = [i for i in items if i not in twice]
    if any("test_solution_passes_every_check" in str(a) for a in config.args):
        return  # named: it runs
    dropped = [
        i
        for i in items
        if getattr(i, "originalname", "") == "test_solution_passes_every_check"
        and i.nodeid.startswith("tests/test_grading.py::")
        and i.callspec.id in by_nbval
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


# --- The suite's time: every test's duration, as it goes, and the budget said at the end -------------------------
# Each finished test phase appends a line to artifacts/test_durations.jsonl (wall seconds, and the CPU seconds of
# this process and its reaped children), so a long run can be read while it runs; the summary prints the total,
# the 25 slowest files and tests, and says so when the suite passes its budget (SIMLIB_SUITE_BUDGET_MIN, 25 min).
import json
import resource
import time

_SUITE = {"start": time.time(), "tests": {}}
_BUDGET_MIN = float(os.environ.get("SIMLIB_SUITE_BUDGET_MIN", "25"))


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_configure(config):
    # `-n 2` (pytest-xdist, the README's command): whole files to each worker, never a file's tests split over
    # two (a notebook's cells share one kernel; a module's warm cluster is started once).
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadfile"
    # The tests run in the worker processes and their reports reach the controller as well: the CPU seconds and
    # the durations file are the worker's, the totals and the lists the controller's.
    _SUITE["controller"] = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_runtest_logstart(nodeid, location):
    _SUITE["tests"][nodeid] = {"cpu0": _cpu_seconds(), "wall": 0.0}


def pytest_runtest_logreport(report):
    entry = _SUITE["tests"].setdefault(report.nodeid, {"cpu0": _cpu_seconds(), "wall": 0.0})
    entry["wall"] += report.duration
    if report.outcome != "passed" and entry.get("outcome", "passed") == "passed":
        entry["outcome"] = report.outcome  # the first phase that did not pass (a failed call, a skipped setup)
    if report.when == "teardown":
        entry["cpu"] = _cpu_seconds() - entry.pop("cpu0")
        if _SUITE.get("controller"):
            return  # the worker that ran it wrote its line
        out = ROOT / "artifacts"
        out.mkdir(exist_ok=True)
        with open(out / "test_durations.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "test": report.nodeid,
                        "wall": round(entry["wall"], 2),
                        "cpu": round(entry["cpu"], 2),
                        "outcome": entry.get("outcome", "passed"),
                        "t": round(time.time() - _SUITE["start"], 1),
                    }
                )
                + "\n"
            )


def pytest_terminal_summary(terminalreporter):
    tests = {k: v for k, v in _SUITE["tests"].items() if "cpu" in v}
    if not tests:
        return
    total = time.time() - _SUITE["start"]
    by_file: dict[str, float] = {}
    for nodeid, v in tests.items():
        by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + v["wall"]
    tr = terminalreporter
    tr.section("the suite's time")
    workers = getattr(tr.config.option, "numprocesses", None) or 0
    side = f" on {workers} workers side by side" if _SUITE.get("controller") else ""
    tr.write_line(f"{len(tests)} tests in {total / 60:.1f} min{side} (load average now {os.getloadavg()[0]:.1f})")
    tr.write_line("the 25 slowest files:")
    for name, wall in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
        tr.write_line(f"  {wall:8.1f} s  {name}")
    if total > _BUDGET_MIN * 60:
        tr.write_line(
            f"WARNING: the suite took {total / 60:.1f} min, over its {_BUDGET_MIN:.0f}-minute budget "
            "(CONTRIBUTING, 'Tests, CI and budgets'): find the new time with the lists above.",
            red=True,
        )
