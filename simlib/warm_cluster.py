"""``Cluster(world_size)``: worker processes with a process group, kept warm between calls (a call costs
milliseconds), and their life cycle: started by PyTorch's elastic agent (:class:`simlib.agent.ElasticWorkers`),
closed with their cell, their caller or the interpreter, restarted after a failure. A call on them is
:mod:`simlib.cluster_calls`'s.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import warnings
import weakref

from . import env
from .agent import ElasticWorkers
from .cluster_calls import Calls, _check_positive
from .errors import OversubscribedWarning


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int >= 1 (the number of processes), got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (the number of processes), got {world_size}")
    return world_size


_live_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()


def _cell_origin():
    """Where a Cluster is created, if that is a notebook/IPython cell: (cell file, line, execution count).

    ipykernel names a cell's file after a hash of its source, so re-running a cell gives the same file."""
    if "IPython" not in sys.modules:  # not in IPython (and importing it would cost a script time)
        return None
    ip = sys.modules["IPython"].get_ipython()
    if ip is None:
        return None
    frame = sys._getframe(1)
    here = os.path.dirname(os.path.abspath(__file__))
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
        frame = frame.f_back
    if frame is None or ip.compile.format_code_name(frame.f_code.co_filename) is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, ip.execution_count


@atexit.register
def _close_all() -> None:
    for cluster in list(_live_clusters):
        cluster.close()


class Cluster(Calls, ElasticWorkers):
    """``world_size`` worker processes with a process group, kept warm between calls.

    >>> with Cluster(2) as cluster:               # doctest: +SKIP
    ...     cluster.run(lambda: dist.get_rank())  # [0, 1]

    Args:
        world_size: number of processes (ranks).
        backend: ``"auto"`` (NCCL when every rank has its own GPU, else Gloo), ``"gloo"`` or ``"nccl"``.
        timeout: seconds a collective waits for its peers before it fails on that rank.
        threads: torch threads per worker; default cores // world_size, at least 1.
        device: ``"auto"`` (cuda:<local_rank> under NCCL, else CPU) or a device string.
        call_timeout: default limit in seconds for a whole call (None: no limit).
        grace: seconds the other ranks get to finish after one rank fails, before they are stopped.
        start_timeout: seconds to wait for the workers to start and join the process group.
        relay_output: send workers' stdout/stderr here, whole lines prefixed ``[rank r]``.
        max_restarts: restarts the elastic agent may make after failures over these workers' life (as
            ``torchrun --max-restarts``); a failed call then runs again on the restarted workers.
        hang_finder: note each rank's collectives, so that a timed-out call's error names the first collective
            where the ranks differ and the rank behind (:mod:`simlib.debug.hangs`; a few microseconds each).
    """

    def __init__(
        self,
        world_size: int,
        backend: str = "auto",
        timeout: float = env.DEFAULT_TIMEOUT,
        threads: int | None = None,
        device: str = "auto",
        call_timeout: float | None = None,
        grace: float = 3.0,
        start_timeout: float = 120.0,
        relay_output: bool = True,
        max_restarts: int = 0,
        hang_finder: bool = True,
    ):
        self.world_size = _check_world_size(world_size)
        self.backend = env.pick_backend(backend, world_size)  # raises ValueError for bad names
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an int >= 1 (torch threads per worker), got {threads!r}")
        self.timeout = _check_positive("timeout", timeout, allow_none=False)
        self.call_timeout = _check_positive("call_timeout", call_timeout)
        self.grace = grace
        self.start_timeout = start_timeout
        self.cores = env.cpu_count()
        self.threads = threads or env.threads_per_worker(world_size, self.cores)
        self.device = device
        self.relay_output = relay_output
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0 (restarts after failures), got {max_restarts!r}")
        self.max_restarts = max_restarts
        self.hang_finder = bool(hang_finder)
        self.attempt = 0  # TORCHELASTIC_RESTART_COUNT of the current workers
        self.restarts = 0
        self.last_start_seconds = None
        if self.backend == "gloo" and world_size > self.cores:
            warnings.warn(
                f"{world_size} workers on {self.cores} cores: the workers share cores, so timings "
                "include oversubscription (expect each worker to run slower).",
                OversubscribedWarning,
                stacklevel=2,
            )
        self._pids: dict[int, int] = {}
        self._conns = {}
        self._queue: queue.Queue = queue.Queue()
        self._call_id = 0
        self._broken = False
        self._checking = False
        self._closed = True
        self._agent = None
        self._lock = threading.RLock()  # one call at a time: a second thread waits for the first one's call
        self._key = None  # set by cluster() for the process's shared cluster
        self._origin = _cell_origin()
        self._close_previous_from_this_cell()
        _live_clusters.add(self)
        self._start()

    def _close_previous_from_this_cell(self) -> None:
        """Re-running a notebook cell that creates a Cluster closes the one its previous run created (which
        ``Out[n]`` or a variable may still hold), so re-runs never pile up idle workers."""
        if self._origin is None:
            return
        for other in list(_live_clusters):
            origin = other._origin
            if (
                other is not self
                and origin is not None
                and origin[:2] == self._origin[:2]
                and origin[2] != self._origin[2]
                and not other._closed
            ):
                other.close()
                print(
                    f"simlib: closed the {other.world_size}-worker cluster this cell created when it last ran",
                    file=sys.stderr,
                )

    def __reduce__(self):
        raise TypeError(
            f"a Cluster of {self.world_size} worker(s) lives in the calling process and cannot be sent "
            "to its workers; inside a worker, use torch.distributed directly"
        )

    # ── life cycle (starting and stopping: simlib.agent.ElasticWorkers) ──
    def close(self) -> None:
        """Stop the workers cleanly (they leave the process group and exit)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        for chan in self._conns.values():
            try:
                chan.send(("stop",))
            except OSError:
                pass
        self._agent.join(10.0)
        self._drain()
        if self._agent.is_alive():
            self._kill()
        else:
            self._finish()

    def restart(self) -> None:
        """Stop the workers (however they are) and start fresh ones."""
        self._kill()
        self._start()
        self._broken = False
        self.restarts += 1

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers, by rank."""
        return [self._pids[r] for r in sorted(self._pids)]

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("needs restart" if self._broken else "ready")
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}, threads={self.threads}, {state})"
