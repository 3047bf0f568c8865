"""Run a function on N fresh processes, from a script or a notebook cell.

``launch(fn, world_size, *args, **kwargs)`` starts ``world_size`` workers with PyTorch's elastic agent (the
engine behind ``torchrun``), so each worker sees torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), joins the process group, runs ``fn`` and sends back its
return value. ``fn`` travels as cloudpickle bytes, so a function defined in a notebook cell works. The agent
starts each worker as a command (``python -c`` + :data:`simlib.worker.BOOTSTRAP`), as torchrun does, never by
re-importing the caller's ``__main__``: a notebook, IPython, a script with or without the ``__main__`` guard,
``python -c`` and a script on standard input all work. On Linux, CPU workers are forked from a process that imported
torch once for the caller (:mod:`simlib.zygote`): a start costs tenths of a second instead of seconds.

``Cluster(world_size)`` keeps the same workers and their process group warm: a call costs milliseconds. The pieces,
one concept each: :mod:`simlib.warm_cluster` (a ``Cluster``: its workers' life cycle), :mod:`simlib.cluster_calls`
(one call on them: results, failures, restarts), :mod:`simlib.agent` (the elastic agent), :mod:`simlib.worker` (the
worker side), :mod:`simlib.zygote` (CPU workers forked from a warm process).

How the pieces talk:

    caller process                       worker process (one per rank, own process group)
    ───────────────                      ───────────────────────────────────────────────
    Listener on 127.0.0.1  <── connect ── hello(rank, pid); init_process_group; ready
    run(fn): send call ───────────────>  fn(*args, **kwargs)
    print "[rank r] line"  <── out ────── stdout/stderr (fd level, whole lines)
    results by rank        <── result ─── return value (plain=True: plain data, read restricted), or the
                                          exception's type, message and traceback as text (never unpickled)

Failure rules: an exception on a rank is raised here as :class:`WorkerError` naming the rank(s); ranks that
do not finish within ``grace`` seconds of the first failure are stopped (and the cluster restarts on its next
call); a collective that waits longer than ``timeout`` fails on its rank; Ctrl-C stops every worker, at any
moment, with one line. Workers die with the caller (``PR_SET_PDEATHSIG`` plus a watchdog) and with their
``Cluster`` (no thread holds one; re-running the notebook cell that made one closes the old one), so nothing is
left orphaned or idle.

Restarts (``max_restarts=k``, as ``torchrun --max-restarts``): after a failure the elastic agent restarts every
worker (a rank that died, an exception, a collective that timed out, a call past its time limit) and the call runs
again on the fresh workers, up to k times; each worker reads its attempt in ``TORCHELASTIC_RESTART_COUNT``
(``simlib.init().restart_count``). One line per restart is printed here; when the restarts are spent, the
:class:`WorkerError` lists every attempt's cause (``error.attempts``).
"""

from __future__ import annotations

from . import env
from .errors import Interrupted, OversubscribedWarning, RemoteFailure, WorkerError, WorkerTimeout
from .warm_cluster import Cluster

__all__ = [
    "launch",
    "Cluster",
    "cluster",
    "WorkerError",
    "WorkerTimeout",
    "RemoteFailure",
    "OversubscribedWarning",
    "Interrupted",
]


def launch(
    fn,
    world_size: int,
    *args,
    backend: str = "auto",
    timeout: float = env.DEFAULT_TIMEOUT,
    threads: int | None = None,
    device: str = "auto",
    call_timeout: float | None = None,
    max_restarts: int = 0,
    plain: bool = False,
    **kwargs,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh processes; return the results by rank (``plain``: as
    for :meth:`Cluster.call`).

    One-shot: the workers start, run ``fn`` once and exit. Use :class:`Cluster` to keep them warm.
    ``backend``, ``timeout``, ``threads``, ``device`` are as for :class:`Cluster`; ``call_timeout``
    limits the whole call; ``max_restarts=k`` runs ``fn`` again on restarted workers after a failure, up to k
    times (as ``torchrun --max-restarts``). Works from a notebook, IPython, any script, ``python -c`` and
    standard input: the workers never re-import the caller's ``__main__``.
    """
    cluster = _OneShot(
        world_size,
        backend=backend,
        timeout=timeout,
        threads=threads,
        device=device,
        call_timeout=call_timeout,
        max_restarts=max_restarts,
    )
    try:
        return cluster.call(fn, args, kwargs, plain=plain)
    finally:
        cluster.close()


_OneShot = type("_OneShot", (Cluster,), {"one_shot": True})  # simlib.agent: no zygote started for one call
_shared: Cluster | None = None


def shared_cluster() -> Cluster | None:
    """This process's warm cluster (:func:`cluster`'s), or None when there is none."""
    return _shared


def cluster(world_size: int, **options) -> Cluster:
    """This process's warm cluster of ``world_size`` workers: started on first use, then returned again.

    A notebook cell ``cluster = simlib.cluster(2)`` can be re-run at no cost (the same workers come back).
    Asking for another size or other options closes the previous shared cluster first, so one kernel holds
    at most one of them. ``options`` are :class:`Cluster`'s.
    """
    global _shared
    key = (world_size, sorted(options.items()))
    if _shared is not None and _shared._key == key:
        return _shared
    if _shared is not None:
        _shared.close()
    _shared = Cluster(world_size, **options)
    _shared._key = key
    return _shared
