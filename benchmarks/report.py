"""What every benchmark records the same way: the machine and its load, and the JSON file in results/.

On a shared 2-core box the load average decides how far timings can be trusted, so every result keeps it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine(load_before, **extra) -> dict:
    """Cores, torch and Python versions, the date, and the load average before and after the run."""
    import torch

    from simlib import env

    return dict(
        cores=env.cpu_count(),
        torch=torch.__version__,
        python=platform.python_version(),
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        loadavg_before=list(load_before),
        loadavg_after=list(os.getloadavg()),
        **extra,
    )


def write(result: dict, path=None) -> Path:
    """Write ``result`` as JSON to ``path`` (default ``results/<benchmark>.json``) and return the path."""
    path = Path(path) if path is not None else RESULTS / f"{result['benchmark']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
