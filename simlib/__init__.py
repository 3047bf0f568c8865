"""simlib: run, measure and simulate distributed training from a notebook.

The few names most lessons need are here; the rest lives in one module per concept
(``simlib.collectives``, ``simlib.parallel.data``, ``simlib.sim``, ...).
"""

from . import debug  # noqa: F401 - the tools plug into the core's hooks (simlib.hooks): hang finder, MFU
from .env import Context, context, cpu_count, init, quick, shutdown
from .launch import (
    Cluster,
    Interrupted,
    OversubscribedWarning,
    RemoteFailure,
    WorkerError,
    WorkerTimeout,
    cluster,
    launch,
)

__version__ = "0.1.0"
__all__ = [
    "launch",
    "Cluster",
    "cluster",
    "Interrupted",
    "init",
    "context",
    "quick",
    "cpu_count",
    "shutdown",
    "Context",
    "WorkerError",
    "WorkerTimeout",
    "RemoteFailure",
    "OversubscribedWarning",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext simlib``: the ``%%distributed`` cell magic and its companions (see :mod:`simlib.magic`)."""
    from .magic import load_ipython_extension as load

    load(ipython, _in_rank)


def _in_rank(name: str, *args):
    """Worker side of a distributed cell: ``simlib.magic``'s ``name``, given this package (the learner's
    namespace holds it) by the package itself, so that ``magic`` never imports the package above it."""
    import sys

    from . import magic

    return getattr(magic, name)(sys.modules[__name__], *args)
