"""Run a function on N fresh processes, from a script or a notebook cell.

``launch(fn, world_size, *args, **kwargs)`` starts ``world_size`` workers with PyTorch's elastic agent (the
engine behind ``torchrun``), so each worker sees torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), joins the process group, runs ``fn`` and sends back its
return value. ``fn`` travels as cloudpickle bytes, so a function defined in a notebook cell works. The agent
starts each worker as a command (``python -c`` + :data:`simlib.worker.BOOTSTRAP`), as torchrun does, never by
re-importing the caller's ``__main__``: a notebook, IPython, a script with or without the ``__main__`` guard,
``python -c`` and a script on standard input all work. On Linux, CPU workers are forked from a process that imported
torch once for the caller (:mod:`simlib.zygote`): a start costs tenths of a second instead of seconds.

``Cluster(world_size)`` keeps the same workers and their process group warm: a call costs milliseconds.

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

import atexit
import os
import queue
import sys
import threading
import time
import warnings
import weakref

import cloudpickle

from . import env
from . import plain as _plain
from .agent import ElasticWorkers
from .errors import (Interrupted, OversubscribedWarning, RemoteFailure, WorkerError, WorkerTimeout, _cause, _exhausted,
                     describe_exit, learner_traceback, restore_filenames, unpicklable)

__all__ = ["launch", "Cluster", "cluster", "WorkerError", "WorkerTimeout", "RemoteFailure", "OversubscribedWarning",
           "Interrupted"]


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int >= 1 (the number of processes), got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (the number of processes), got {world_size}")
    return world_size


def _check_positive(name, value, allow_none=True):
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return value


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


class Cluster(ElasticWorkers):
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

    def __init__(self, world_size: int, backend: str = "auto", timeout: float = env.DEFAULT_TIMEOUT,
                 threads: int | None = None, device: str = "auto", call_timeout: float | None = None,
                 grace: float = 3.0, start_timeout: float = 120.0, relay_output: bool = True,
                 max_restarts: int = 0, hang_finder: bool = True):
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
            warnings.warn(f"{world_size} workers on {self.cores} cores: the workers share cores, so timings "
                          "include oversubscription (expect each worker to run slower).",
                          OversubscribedWarning, stacklevel=2)
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
            if (other is not self and origin is not None and origin[:2] == self._origin[:2]
                    and origin[2] != self._origin[2] and not other._closed):
                other.close()
                print(f"simlib: closed the {other.world_size}-worker cluster this cell created when it last ran",
                      file=sys.stderr)

    def __reduce__(self):
        raise TypeError(f"a Cluster of {self.world_size} worker(s) lives in the calling process and cannot be sent "
                        "to its workers; inside a worker, use torch.distributed directly")

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
        return (f"Cluster(world_size={self.world_size}, backend={self.backend!r}, threads={self.threads}, "
                f"{state})")

    # ── calls ──
    def _print(self, msg) -> None:
        _, rank, stream, line = msg
        print(f"[rank{rank}] {line}", file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def _drain(self) -> None:
        """Empty the queue after a call: print the workers' output; keep what workers the agent has already
        restarted said ("conn", "ready", "fatal") for :meth:`_await_workers`. Dropped, a new worker's connection
        was closed with its message, and the worker, seeing it close, exited: the agent then ended and the
        restart failed with "the workers exited before they joined" (seen in a loaded CI run, when the agent
        restarted the workers within the grace time after a killed rank)."""
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "out":
                self._print(msg)
            elif msg[0] in ("conn", "ready", "fatal"):
                self._stash.append(msg)

    def run(self, fn, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results by rank."""
        return self.call(fn, args, kwargs)

    def call(self, fn, args=(), kwargs=None, timeout: float | None = None, plain: bool = False) -> list:
        """Like :meth:`run`, with a time limit for the whole call (``timeout`` seconds).

        ``plain=True``: each rank's result is converted in the worker to plain data of exact types and read here
        restricted (:mod:`simlib.plain`): no code of the worker's runs here; anything else fails that rank
        (``NotPlain``, naming it and the type). The grader calls so. Calls from several threads run one by one.
        """
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        with self._lock:
            return self._call(fn, args, kwargs, timeout, plain)

    def _call(self, fn, args, kwargs, timeout, plain=False) -> list:
        timeout = _check_positive("timeout", timeout if timeout is not None else self.call_timeout)
        if self._broken:
            why = self._broken if isinstance(self._broken, str) else "the failure of the previous call"
            self.restart()
            # information (the failure itself was raised, as a WorkerError, by the call that failed): stdout
            print(f"simlib: started {self.world_size} fresh workers ({self.last_start_seconds:.1f} s) "
                  f"after {why}", flush=True)
        elif self._closed:  # closed by the user: reopen
            self._start()
        try:
            payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
        except Exception as exc:  # noqa: BLE001 - say which captured object could not travel
            raise TypeError(unpicklable(fn, args, kwargs or {}, exc)) from None
        attempts = []  # one WorkerError per failed attempt of this call
        while True:
            try:
                return self._call_once(fn, payload, timeout, restartable=self._restarts_left() > 0, plain=plain)
            except WorkerError as err:
                if self._restarts_left() <= 0 or self._agent is None or not self._agent.is_alive():
                    if attempts:
                        raise _exhausted(attempts + [err], self.max_restarts) from None
                    raise
                attempts.append(err)
                self._restart_workers(err)

    def _restarts_left(self) -> int:
        return self.max_restarts - self.attempt

    def _restart_workers(self, err: WorkerError) -> None:
        """The elastic agent restarts every worker after a failure: stop the old ones, wait for the new ones."""
        t0 = time.perf_counter()
        print(f"simlib: {_cause(err)}. Restarting all {self.world_size} workers: restart {self.attempt + 1} of "
              f"max_restarts={self.max_restarts}", file=sys.stderr, flush=True)
        self._kill_workers(restarting=True)  # the agent sees them fail, starts new ones (TORCHELASTIC_RESTART_COUNT + 1)
        self._drop_connections()
        try:
            self._await_workers()
        except BaseException:
            self._kill()
            self._broken = True
            raise
        print(f"simlib: {self.world_size} workers restarted in {time.perf_counter() - t0:.1f} s "
              f"(attempt {self.attempt + 1} of {self.max_restarts + 1}); running the call again",
              file=sys.stderr, flush=True)

    def _call_once(self, fn, payload, timeout, restartable=False, plain=False) -> list:
        self._call_id += 1
        call_id = self._call_id
        self._fn = fn  # for the hang finder's report, in the learner's file names
        results, failures, died = {}, {}, set()
        first_failure = None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:  # from the first send on: a Ctrl-C while some ranks already run the call must stop them too
            for rank, chan in self._conns.items():
                try:
                    chan.send(("call", call_id, payload, plain))
                except OSError:  # the worker ended between calls (and the agent may have restarted it)
                    died.add(rank)
                    failures[rank] = RemoteFailure(rank, "WorkerDied", "the worker process had ended before the "
                                                   "call (killed, crashed, or it called os._exit)", "")
                    first_failure = first_failure or time.monotonic()
            while len(results) + len(failures) < self.world_size:
                now = time.monotonic()
                if first_failure is not None and now - first_failure > self.grace:
                    break
                if deadline is not None and now > deadline:
                    break
                try:
                    msg = self._queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                kind = msg[0]
                if kind == "out":
                    self._print(msg)
                elif kind in ("conn", "ready", "fatal"):  # workers restarted by the agent: for _await_workers
                    self._stash.append(msg)
                elif kind == "result" and msg[2] == call_id:
                    _, rank, _, ok, value = msg  # a failure: a RemoteFailure made of strings (agent._message)
                    ok, value = _plain.read_result(value, rank, plain) if ok else (ok, value)
                    if ok:
                        results[rank] = value
                    else:
                        value.traceback = learner_traceback(restore_filenames(value.traceback, fn))
                        failures[rank] = value
                        first_failure = first_failure or time.monotonic()
                elif (kind == "eof" and msg[1] not in results and msg[1] not in failures
                      and msg[1] in self._conns and self._conns[msg[1]].conn is msg[2]):
                    died.add(msg[1])
                    failures[msg[1]] = (RemoteFailure(msg[1], "Refused", msg[3], "") if len(msg) > 3 else
                                        RemoteFailure(msg[1], "WorkerDied", describe_exit(self._exit_code(msg[1])), ""))
                    first_failure = first_failure or time.monotonic()
        except KeyboardInterrupt:  # the workers are SIGKILLed at once: the message need not wait long for the agent
            self._kill(wait=2.0)      # thread (a daemon) to notice; the next call starts a new agent
            self._broken = "the interrupt"
            print(f"simlib: interrupted; stopped all {self.world_size} workers (the next call starts fresh ones)",
                  file=sys.stderr, flush=True)
            raise Interrupted(f"stopped all {self.world_size} workers") from None  # one line in a notebook
        self._drain()
        if not failures and len(results) == self.world_size:
            return [results[r] for r in range(self.world_size)]
        raise self._fail(results, failures, died, timeout, first_failure, restartable) from None

    def _fail(self, results, failures, died, timeout, first_failure, restartable=False) -> WorkerError:
        pending = [r for r in range(self.world_size) if r not in results and r not in failures]
        if pending and first_failure is None:
            msg = (f"call timed out after {timeout:g} s: rank(s) {pending} did not finish "
                   f"(ranks {sorted(results)} did). A hang or a collective that only some ranks called.")
            failures.update({r: RemoteFailure(r, "Timeout", f"did not finish within {timeout:g} s", "")
                             for r in pending})
            error_type = WorkerTimeout
        else:
            died_first = sorted(r for r, f in failures.items() if f.type_name == "WorkerDied"
                                and "SIGTERM" not in f.message)
            names = ", ".join(str(r) for r in died_first + sorted(set(failures) - set(died_first)))
            names = names.replace(",", " died first; then", 1) if died_first and len(failures) > 1 else names
            msg = f"{len(failures)} of {self.world_size} rank(s) failed (rank {names})"
            error_type = WorkerError
            if any("timed out" in f.message.lower() or "timeout" in f.message.lower()
                   for f in failures.values()):
                error_type = WorkerTimeout
                msg += (f". A collective waited longer than timeout={self.timeout:g} s for its peers: "
                        "usually a collective (or send/recv) that not every rank called, or called in a "
                        "different order")
            if pending:
                silent = "; ".join(f"rank {r} {self._why_silent(r)}" for r in pending)
                if error_type is WorkerTimeout:  # the silent rank is the cause: name it first
                    msg = (f"rank(s) {pending} did not answer ({silent}): rank(s) {sorted(failures)} timed out "
                           f"waiting for them after timeout={self.timeout:g} s. The silent rank(s) were stopped")
                else:
                    msg += (f"; rank(s) {pending} never answered ({silent}) and were stopped {self.grace:g} s after "
                            "the first failure")
        # the cause first: a rank that died (not stopped by SIGTERM, which the agent sends to the others), then
        # the ranks that failed because it was gone
        by_rank = sorted(failures.values(), key=lambda f: (f.type_name != "WorkerDied",
                                                           "SIGTERM" in f.message, f.rank))
        lines = [f.summary() for f in by_rank]
        from . import hooks
        hangs = hooks.tool("hang_finder")  # simlib.debug.hangs, plugged in by simlib.debug
        finder = hangs and hangs.failure_report(
            os.path.join(self._log_dir, "collectives") if self.hang_finder else None, self.world_size, results,
            failures, pending, error_type is WorkerTimeout, getattr(self, "_fn", None),
            {r: self._pids.get(r) for r in pending})
        if finder:
            lines.append(finder)
        detail = "\n".join(f"--- rank {f.rank} traceback ---\n{f.traceback.rstrip()}" for f in by_rank if f.traceback)
        if restartable:  # the caller restarts every worker anyway
            return error_type(msg + "\n" + "\n".join(lines) + ("\n" + detail if detail else ""), failures, results)
        restart_needed = bool(pending or died or error_type is WorkerTimeout) or not self._healthy()
        if restart_needed:
            self._kill()
            self._broken = True
            msg += ". The workers were stopped; the next call starts fresh ones"
        text = msg + "\n" + "\n".join(lines) + ("\n" + detail if detail else "")
        return error_type(text, failures, results)

    def _why_silent(self, rank: int) -> str:
        """What a rank that did not answer is doing, from its process state (Linux /proc)."""
        pid = self._pids.get(rank)
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, TypeError):
            return "did not answer"
        return {"T": "was stopped (SIGSTOP or Ctrl-Z: its process is paused)", "t": "was paused by a debugger",
                "Z": "had exited", "D": "was blocked in the kernel (disk or network I/O)"}.get(
                    state, "was still running (a hang, or a collective it never reached)")

    def _healthy(self) -> bool:
        """After a call in which every rank reported: do the ranks still meet at a barrier?"""
        if self._checking:  # the barrier call itself failed: do not check again
            return False
        self._checking = True
        try:
            self._call_once(_barrier, cloudpickle.dumps((_barrier, (), {})), 5.0, plain=True)
            return True
        except WorkerError:
            return False
        finally:
            self._checking = False


def _barrier():
    import torch.distributed as dist
    dist.barrier()


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = env.DEFAULT_TIMEOUT,
           threads: int | None = None, device: str = "auto", call_timeout: float | None = None,
           max_restarts: int = 0, plain: bool = False, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh processes; return the results by rank (``plain``: as
    for :meth:`Cluster.call`).

    One-shot: the workers start, run ``fn`` once and exit. Use :class:`Cluster` to keep them warm.
    ``backend``, ``timeout``, ``threads``, ``device`` are as for :class:`Cluster`; ``call_timeout``
    limits the whole call; ``max_restarts=k`` runs ``fn`` again on restarted workers after a failure, up to k
    times (as ``torchrun --max-restarts``). Works from a notebook, IPython, any script, ``python -c`` and
    standard input: the workers never re-import the caller's ``__main__``.
    """
    cluster = _OneShot(world_size, backend=backend, timeout=timeout, threads=threads, device=device,
                       call_timeout=call_timeout, max_restarts=max_restarts)
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
