"""Where the tools plug into the core: the launcher, the worker and the trainer call the tool plugged in for a role
and never import a tool's module, so that the tools (``simlib.debug``: the parity check runs the trainer, the memory
tracker is a step hook) may import the core and not the other way round (``tests/test_layout.py``).

    hang_finder   install(directory, rank), new_call(), failure_report(...)   (simlib.debug.hangs)
    peaks         measured_peak(device, dtypes, size, repeats), device_peak(device, mixed_precision)
                  (simlib.debug.mfu: MFU's yardsticks, which every run's summary reports)

``simlib.debug`` plugs its modules in when it is imported, and ``import simlib`` imports it: every process that
imports anything of simlib (a notebook, a worker, ``simlib train``) has them. A module is imported on first use.
"""

from __future__ import annotations

import importlib

_PLUGGED: dict[str, str] = {}  # role -> the module that plays it


def plug(role: str, module: str) -> None:
    """Make ``module`` (an importable name) the tool for ``role``."""
    _PLUGGED[role] = module


def tool(role: str):
    """The module plugged in for ``role`` (imported now, the first time), or None when nothing is."""
    name = _PLUGGED.get(role)
    return importlib.import_module(name) if name else None
