"""Run one notebook cell by cell under a time budget and record every cell: the GPU check's notebook section.

    python benchmarks/gpu_notebooks.py notebooks/12_project_finance.ipynb --budget 200 --json out.json

Each code cell gets ``passed``, ``failed`` (with its error name, value and the tail of its traceback, kept in the
JSON: a failing cell's cause is not lost with a test runner's output), ``timeout`` (the notebook's budget ran out
inside it) or ``not_run`` (after the budget ran out). A failed cell does not stop the notebook (as nbval's lax
mode): later cells are still run and recorded. Cells are numbered as nbval numbers them (code cells from 0), and
``index`` is the cell's place in the notebook. The kernel is this Python (a kernelspec of its own, so a
kernelspec installed elsewhere cannot swap in another interpreter), in quick mode (``SIMLIB_QUICK=1``), in the
notebook's folder. Needs nbclient, nbformat and ipykernel: :data:`NEEDS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

NEEDS = ("nbclient", "nbformat", "ipykernel")
TRACEBACK_CHARS = 3000


def missing(modules=NEEDS) -> list[str]:
    """The modules of ``modules`` this Python cannot import."""
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def _kernelspec(root: Path) -> str:
    """A kernelspec named ``gpu-check`` that starts this very Python; returns its name (JUPYTER_PATH -> root)."""
    spec = root / "kernels" / "gpu-check"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "gpu check (this Python)",
                "language": "python",
            }
        )
    )
    os.environ["JUPYTER_PATH"] = str(root) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    return "gpu-check"


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def run_notebook(path, budget: float, quick: bool = True) -> dict:
    """Execute ``path`` cell by cell within ``budget`` seconds; return the notebook's record (see the module doc)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path).resolve()
    if quick:
        os.environ["SIMLIB_QUICK"] = "1"
    nb = nbformat.read(str(path), as_version=4)
    start = time.monotonic()
    deadline = start + budget
    cells, code_number, stopped = [], 0, None
    with tempfile.TemporaryDirectory() as tmp:
        client = NotebookClient(
            nb,
            timeout=max(1, int(budget)),
            kernel_name=_kernelspec(Path(tmp)),
            allow_errors=False,
            resources={"metadata": {"path": str(path.parent)}},
        )
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                row = {"cell": code_number, "index": index, "first_line": (cell.source.splitlines() or [""])[0][:80]}
                code_number += 1
                left = deadline - time.monotonic()
                if stopped or left < 1:
                    row["status"] = "not_run"
                    stopped = stopped or "budget"
                    cells.append(row)
                    continue
                client.timeout = max(1, int(left))
                t0 = time.monotonic()
                try:
                    client.execute_cell(cell, index)
                    row["status"] = "passed"
                except CellTimeoutError:
                    row["status"], stopped = "timeout", "budget"
                    row["error"] = f"the notebook's budget ({budget:.0f} s) ran out in this cell"
                except DeadKernelError as exc:
                    row["status"], stopped = "failed", "kernel died"
                    row["error"] = f"DeadKernelError: {exc}"
                except CellExecutionError as exc:
                    row["status"] = "failed"
                    row["error"] = f"{exc.ename}: {exc.evalue}"[:500]
                    row["traceback"] = _strip_ansi(str(exc))[-TRACEBACK_CHARS:]
                row["seconds"] = round(time.monotonic() - t0, 1)
                cells.append(row)
    counts = {s: sum(c["status"] == s for c in cells) for s in ("passed", "failed", "timeout", "not_run")}
    status = "passed" if counts["passed"] == len(cells) else "failed" if counts["failed"] else "incomplete"
    return {
        "notebook": path.name,
        "status": status,
        "seconds": round(time.monotonic() - start, 1),
        "budget": budget,
        **counts,
        "cells": cells,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for the whole notebook")
    parser.add_argument("--json", required=True, help="where to write the record")
    args = parser.parse_args(argv)
    lacking = missing()
    if lacking:
        record = {
            "notebook": Path(args.notebook).name,
            "status": "skipped",
            "error": f"missing {', '.join(lacking)}: pip install {' '.join(lacking)}",
        }
    else:
        try:
            record = run_notebook(args.notebook, args.budget)
        except Exception as exc:  # noqa: BLE001 - recorded: the kernel would not start, the file would not read
            record = {"notebook": Path(args.notebook).name, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
