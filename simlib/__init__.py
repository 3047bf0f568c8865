"""simlib: run, measure and simulate distributed training from a notebook.

The few names most lessons need are here; the rest lives in one module per concept
(``simlib.collectives``, ``simlib.parallel.data``, ``simlib.sim``, ...).
"""
from .env import Context, context, cpu_count, init, quick, shutdown
from .launch import Cluster, OversubscribedWarning, RemoteFailure, WorkerError, WorkerTimeout, launch

__version__ = "0.1.0"
__all__ = ["launch", "Cluster", "init", "context", "quick", "cpu_count", "shutdown", "Context", "WorkerError", "WorkerTimeout",
           "RemoteFailure", "OversubscribedWarning"]
