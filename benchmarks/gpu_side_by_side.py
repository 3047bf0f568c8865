"""The GPU check's last phase, side by side: the notebooks that reach the GPU (each in its own kernel, every cell
recorded: ``benchmarks/gpu_notebooks.py``), tests/test_gpu.py, the device guard and ``simlib scaling``.

Only the notebooks whose cells reach a GPU run there by default (:data:`GPU_NOTEBOOKS`): the other lessons run on
CPU workers over Gloo whatever the machine, CI runs them, and all 15 at once on 16 cores left notebook 12 short of
its budget last time (211 s needed, 17 jobs). ``--all-notebooks`` runs every one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpu_jobs import ROOT, finish, install_hint, missing, start

# seconds for the phase (a notebook's own budget: 10 s less, so it writes its record first). Notebook 12 needed
# 211 s among 17 jobs on the H200's 16 cores (2026-12-04); here it shares them with 7 jobs: about 100 s of work
# by that measure, so 160 s is 60 % over it
BUDGET = 170
# the lessons whose cells use a GPU when there is one: 05b (one device's step), the three projects (world 1 ->
# NCCL on cuda:0), 00 (doctor: what the machine has)
GPU_NOTEBOOKS = (
    "00_getting_started",
    "05b_one_device_step",
    "10_project_gpt",
    "11_project_vision",
    "12_project_finance",
)
EXTRAS = {
    "notebooks": ("nbclient", "nbformat", "ipykernel", "ipywidgets", "matplotlib"),
    "gpu_tests": ("pytest",),
    "device_guard": ("pytest",),
}


def notebooks(folder=ROOT / "notebooks", every: bool = False):
    found = sorted(Path(folder).glob("[0-9]*.ipynb"))
    return found if every else [nb for nb in found if nb.stem in GPU_NOTEBOOKS]


def jobs(tmp: Path, skip=(), py: str = sys.executable, every: bool = False) -> dict:
    """The commands run side by side (each killed at the phase's budget)."""
    budget = BUDGET - 10
    out = {
        "gpu_tests": [
            py,
            "-m",
            "pytest",
            "tests/test_gpu.py",
            "-q",
            "-p",
            "no:nbval",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-rs",
        ],
        "device_guard": [
            py,
            "-m",
            "pytest",
            "tests/test_device_guard.py",
            "-q",
            "-p",
            "no:nbval",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
        ],
        "scaling": [py, "-m", "simlib", "scaling", "--quick", "--out", str(tmp / "scaling")],
    }
    for nb in notebooks(every=every):
        out[f"notebook {nb.stem}"] = [
            py,
            str(ROOT / "benchmarks" / "gpu_notebooks.py"),
            str(nb),
            "--budget",
            str(budget),
            "--json",
            str(tmp / f"{nb.stem}.json"),
        ]
    return {k: v for k, v in out.items() if section_of(k) not in skip}


def section_of(job: str) -> str:
    return "notebooks" if job.startswith("notebook ") else job


def side_by_side(tmp: Path, skip=(), every: bool = False) -> dict:
    """Start every job at once; wait for each to its budget; the notebooks' per-cell records read back."""
    sections = {}
    lacking = {section: missing(modules) for section, modules in EXTRAS.items()}
    started = {}
    for name, cmd in jobs(tmp, skip, every=every).items():
        if lacking.get(section_of(name)):
            continue
        started[name] = start(cmd, env={"SIMLIB_QUICK": "1"} if section_of(name) == "notebooks" else None)
    print(f"gpu_check: {len(started)} jobs side by side (budget {BUDGET} s) ...", flush=True)
    done = {name: finish(job, BUDGET) for name, job in started.items()}
    for name in ("gpu_tests", "device_guard", "scaling"):
        if name in skip:
            sections[name] = {"status": "skipped", "why": "--skip"}
        elif lacking.get(name):
            sections[name] = {
                "status": "skipped",
                "why": f"missing {', '.join(lacking[name])}: {install_hint(lacking[name])}",
            }
        else:
            sections[name] = {k: v for k, v in done[name].items() if k != "output"}
    if "notebooks" in skip:
        sections["notebooks"] = {"status": "skipped", "why": "--skip"}
    elif lacking["notebooks"]:
        sections["notebooks"] = {
            "status": "skipped",
            "why": f"missing {', '.join(lacking['notebooks'])}: {install_hint(lacking['notebooks'])}",
        }
    else:
        sections["notebooks"] = notebook_section(tmp, {k: v for k, v in done.items() if k.startswith("notebook ")})
    return sections


def notebook_section(tmp: Path, done: dict) -> dict:
    records = {}
    for name, job in done.items():
        stem = name.split(" ", 1)[1]
        path = tmp / f"{stem}.json"
        if path.exists():
            records[stem] = json.loads(path.read_text())
        else:  # killed before it wrote its record
            records[stem] = {"status": "failed", "error": "no record: " + job["output_tail"][-1500:]}
    failed = sorted(k for k, r in records.items() if r.get("status") == "failed")
    incomplete = sorted(k for k, r in records.items() if r.get("status") == "incomplete")
    return {
        "status": "failed" if failed else "incomplete" if incomplete else "passed",
        "failed": failed,
        "incomplete": incomplete,
        "notebooks": records,
    }
