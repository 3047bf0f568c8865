"""The reference run: every lesson and project notebook executed once, in quick mode, its outputs kept.

``python -m simlib.site reference`` runs each notebook of ``notebooks/`` in a fresh kernel (nbclient, the kernel of
this Python, working directory ``notebooks/`` as under the test suite, ``SIMLIB_QUICK=1``) and writes the executed
copy to ``docs/reference/<name>.ipynb`` with ``docs/reference/run.json`` beside it: the machine (CPU model, cores
this process may use, memory, torch), the commit, the date, and per notebook its wall time, the load average
sampled while it ran (a shared machine inflates every timing: read a timing with its load), whether every cell ran,
and a hash of each cell's source so the site can tell which outputs still belong to today's cells.

The site (``python -m simlib.site build``) shows these outputs; nothing is executed at build time. Figures are kept
as PNG; interactive explorers (ipywidgets) are replaced by a line saying to open the notebook, since their state
needs a kernel (and a widget manager from a CDN) to mean anything.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "docs" / "reference"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
EXPLORER_NOTE = "(an interactive explorer: open the notebook in JupyterLab and run it to use it)\n"


def cell_hash(source: str | list[str]) -> str:
    """A short hash of one cell's source: the key that ties a reference output to the cell that made it."""
    text = "".join(source) if isinstance(source, list) else source
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _machine() -> dict:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        mem_gib = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    import torch

    from simlib import env

    return {
        "cpu": model,
        "cores": env.cpu_count(),
        "memory_gib": mem_gib,
        "gpus": env.gpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "notebooks"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + (" (notebooks edited since)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


class _LoadSampler:
    """The 1-minute load average every few seconds while a notebook runs: min, median and max."""

    def __init__(self, every: float = 5.0):
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        s = sorted(self.samples)
        return {"min": round(s[0], 1), "median": round(s[len(s) // 2], 1), "max": round(s[-1], 1)}


def strip_widgets(nb) -> int:
    """Replace every widget view by a line of text and drop the widget state; return how many were replaced."""
    import nbformat

    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}):
                replaced += 1
                if not any(o.get("text") == EXPLORER_NOTE for o in outputs):
                    outputs.append(nbformat.v4.new_output("stream", name="stdout", text=EXPLORER_NOTE))
                continue
            outputs.append(out)
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)
    return replaced


def run_one(path: Path, out_dir: Path, timeout: int = 900) -> dict:
    """Execute one notebook in quick mode; write the executed copy; return its row for run.json."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )  # widget state is stored (nbclient's Output-widget hook needs it) and stripped below
    status, t0 = "ok", time.perf_counter()
    with _LoadSampler() as load:
        try:
            client.execute()
        except (CellExecutionError, CellTimeoutError) as exc:
            index = next(
                (
                    i
                    for i, c in enumerate(nb.cells)
                    if any(o.get("output_type") == "error" for o in c.get("outputs", []))
                ),
                None,
            )
            status = f"stopped at cell {index}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
        except Exception as exc:  # the executor itself failed: say so in the record, go on with the next notebook
            status = f"not run to the end: {type(exc).__name__}: {exc}"[:300]
    seconds = time.perf_counter() - t0
    widgets = strip_widgets(nb)
    nb.metadata["simlib_reference"] = {"notebook": f"notebooks/{path.name}", "quick": True}
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / path.name)
    return {
        "notebook": f"notebooks/{path.name}",
        "status": status,
        "seconds": round(seconds, 1),
        "load_average": load.summary(),
        "explorers_replaced": widgets,
        "cells": [cell_hash(c.source) for c in nb.cells],
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(names: list[str] | None = None, out_dir: Path = OUT) -> dict:
    """Run the named notebooks (all of ``notebooks/`` when none is named); merge their rows into run.json."""
    os.environ["SIMLIB_QUICK"] = "1"
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if names:
        wanted = {n.removesuffix(".ipynb").split("/")[-1] for n in names}
        unknown = wanted - {p.stem for p in paths}
        if unknown:
            raise SystemExit(f"no such notebook in notebooks/: {', '.join(sorted(unknown))}")
        paths = [p for p in paths if p.stem in wanted]
    record_path = out_dir / "run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"notebooks": {}}
    record.update(
        {
            "what": "every notebook of notebooks/ executed once in quick mode (SIMLIB_QUICK=1) by "
            "`python -m simlib.site reference`; timings are this machine's at the load shown",
            "machine": _machine(),
        }
    )
    for path in paths:
        print(f"reference: {path.name} ...", flush=True)
        row = run_one(path, out_dir)
        row["commit"] = _commit()
        record["notebooks"][path.stem] = row
        print(f"reference: {path.name} {row['status']} in {row['seconds']} s, load {row['load_average']}", flush=True)
        record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
