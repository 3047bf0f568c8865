"""The worker processes behind a :class:`simlib.launch.Cluster`: started by torch's elastic agent (the engine of
``torchrun``), connected back to the caller, stopped and cleaned up.

``ElasticWorkers`` is the life-cycle half of ``Cluster`` (start, wait for every rank to join, explain a failed
start, kill, finish); ``Cluster`` (``simlib/warm_cluster.py``, its calls ``simlib/cluster_calls.py``) adds the calls, output relay, failures and restarts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import Listener

from . import env, pace, zygote
from .errors import Interrupted, RemoteFailure, WorkerError, WorkerTimeout
from .plain import NotPlain, frame_loads
from .worker import BOOTSTRAP, Channel


def _message(data: bytes, rank: int) -> tuple:
    """One worker message, read without running any of the worker's code (:func:`simlib.plain.frame_loads`); a
    failure's (type, message, traceback) strings become a :class:`RemoteFailure` here. NotPlain if malformed."""
    msg = frame_loads(data)
    if msg[0] in ("out", "ready", "fatal", "result") and len(msg) > 1:
        msg = (msg[0], rank) + msg[2:]  # the rank of the connection it came on, not the one it claims
    if msg[0] in ("fatal", "result"):
        fields = msg[-1]
        if msg[0] == "result" and msg[-2] is True:
            if len(msg) != 5 or type(fields) is not bytes:
                raise NotPlain(f"rank {rank} sent a malformed result")
            return msg
        if type(fields) is not tuple or len(fields) != 3 or not all(type(x) is str for x in fields):
            raise NotPlain(f"rank {rank} sent a malformed failure report")
        return msg[:-1] + (RemoteFailure(rank, *fields),)
    return msg


def _read(q: queue.Queue, rank: int, conn) -> None:
    """Forward one worker's messages to the caller's queue (holds no Cluster reference). A message this process
    refuses to read ends the connection: the rank counts as failed, with why."""
    while True:
        try:
            msg = _message(conn.recv_bytes(), rank)
        except (EOFError, OSError):
            q.put(("eof", rank, conn))
            return
        except NotPlain as exc:
            q.put(
                (
                    "eof",
                    rank,
                    conn,
                    f"rank {rank} sent a message the caller refuses to read ({exc}); its workers are stopped",
                )
            )
            conn.close()
            return
        q.put(msg)


def _last_lines(log_dir: str, local_rank: int, n: int = 6) -> str:
    """The last lines a worker wrote to stderr (then stdout) before it connected, from the agent's log files."""
    import glob

    for stream in ("stderr", "stdout"):
        for path in glob.glob(os.path.join(log_dir, "**", str(local_rank), f"{stream}.log"), recursive=True):
            try:
                text = open(path, errors="replace").read().strip()
            except OSError:
                continue
            if text:
                return "\n".join(text.splitlines()[-n:])
    return ""


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


class _quiet_elastic:
    """The elastic agent logs each start and each stopped worker ("failed (exitcode: -9)" when a Cluster stops its
    workers); simlib reports those itself (a failure: as a WorkerError naming the rank). One agent thread per
    Cluster, and clusters overlap (a notebook's cluster2 and cluster4): the loggers stay quiet while any agent runs
    and get their levels back when the last one ends (restored by the first to end, a second cluster's intended
    shutdown printed torch's failure lines in red)."""

    names = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    _lock = threading.Lock()
    _active = 0
    _levels: dict = {}

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._active == 0:
                cls._levels = {n: logging.getLogger(n).level for n in self.names}
                for n in self.names:
                    logging.getLogger(n).setLevel(logging.CRITICAL)
            cls._active += 1

    def __exit__(self, *exc):
        cls = type(self)
        with cls._lock:
            cls._active -= 1
            if cls._active == 0:
                for n, level in cls._levels.items():
                    logging.getLogger(n).setLevel(level)


_agents: dict = {}  # run_id -> the elastic agent of a Cluster (so that closing it can stop its restarts)


def _remove_stale_dirs() -> None:
    """Remove ``simlib-<pid>-*`` folders (logs and the workers' spec with its connection key) whose process is gone:
    a caller killed with SIGKILL cannot remove its own."""
    root, uid = tempfile.gettempdir(), os.getuid() if hasattr(os, "getuid") else None
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = re.match(r"^simlib-(\d+)-", name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        path = os.path.join(root, name)
        try:
            if uid is not None and os.stat(path).st_uid != uid:
                continue
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _track_agents() -> None:
    """Have torch's launcher register its LocalElasticAgent here: a Cluster that stops its workers for good must
    first set the agent's remaining restarts to 0, or the agent would start new workers."""
    from torch.distributed.launcher import api

    if getattr(api.LocalElasticAgent, "_simlib_tracked", False):
        return
    base = api.LocalElasticAgent

    class TrackedAgent(base):
        _simlib_tracked = True

        def __init__(self, spec, *args, **kwargs):
            super().__init__(spec, *args, **kwargs)
            _agents[spec.rdzv_handler.get_run_id()] = self

    api.LocalElasticAgent = TrackedAgent


def _no_more_restarts(run_id) -> None:
    agent = _agents.get(run_id)
    if agent is not None and hasattr(agent, "_remaining_restarts"):
        agent._remaining_restarts = 0


class ElasticWorkers:
    """Start, watch and stop ``world_size`` workers under the elastic agent (the life cycle of a Cluster)."""

    def _start(self) -> None:
        try:
            self._start_workers()
        except KeyboardInterrupt:
            self._kill()
            print(
                f"simlib: interrupted while {self.world_size} workers were starting; stopped them all",
                file=sys.stderr,
                flush=True,
            )
            raise Interrupted(f"stopped all {self.world_size} workers") from None

    def _start_workers(self) -> None:
        t0 = time.perf_counter()
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        self._queue = q = queue.Queue()
        self._pids, self._conns, self._exit_pids = {}, {}, {}
        self._stash = []
        authkey = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        self._listener = listener  # open while the agent lives: restarted workers connect to it too
        _remove_stale_dirs()
        # mode 0700: the key below stays private; the pid in the name lets a later start remove it if we are killed
        self._log_dir = tempfile.mkdtemp(prefix=f"simlib-{os.getpid()}-")
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=self.world_size,
            run_id=uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{env.free_port()}",
            local_addr="127.0.0.1",
            max_restarts=self.max_restarts,
            monitor_interval=0.1,
            # a worker's output before it connects (start-up errors) goes to files we read on failure
            logs_specs=DefaultLogsSpecs(log_dir=self._log_dir, redirects=Std.ALL if self.relay_output else Std.NONE),
        )
        spec = dict(
            backend=self.backend,
            timeout=self.timeout,
            threads=self.threads,
            device=self.device,
            relay_output=self.relay_output,
            loopback=True,
            address=list(listener.address),
            authkey=authkey.hex(),
            path=[p for p in sys.path if isinstance(p, str)],
            collective_log=(
                os.path.join(self._log_dir, "collectives") if getattr(self, "hang_finder", False) else None
            ),
        )
        spec["bootstrap"] = BOOTSTRAP
        command = ("-c", BOOTSTRAP)
        # CPU workers fork from a process that imported torch; a one-shot launch starts no zygote for itself (its
        # workers then import side by side, where a new zygote's import would come first), but uses one that is there
        if zygote.enabled(self.backend, self.device) and (not getattr(self, "one_shot", False) or zygote.running()):
            spec["zygote"] = zygote.address()
            command = ("-I", "-S", zygote.LAUNCHER)
        spec_file = os.path.join(self._log_dir, "spec.json")
        with open(os.open(spec_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            json.dump(spec, f)
        agent_error = self._agent_errors = []  # the agent thread appends here: it holds the list, not the Cluster
        self._run_id = config.run_id
        _track_agents()

        def agent():  # references no Cluster, so a dropped Cluster is collected (and its workers stopped)
            try:
                with _quiet_elastic():
                    # a command, as torchrun starts: the workers never re-import the caller's __main__
                    elastic_launch(config, sys.executable)(*command, spec_file)
            except BaseException as exc:  # noqa: BLE001 - workers stopped by us end up here too
                agent_error.append(exc)
            finally:
                q.put(("agent-exit", None))

        def accept():
            from multiprocessing import AuthenticationError

            while True:
                try:
                    q.put(("conn", listener.accept()))
                except (AuthenticationError, EOFError, ConnectionError):
                    if getattr(listener, "_listener", None) is None:
                        return  # closed meanwhile
                    # a connection without this cluster's key (a stranger on a reused port): not ours, keep listening
                except (OSError, AttributeError):
                    return  # the listener closed

        self._closed = False
        self._agent = threading.Thread(target=agent, daemon=True, name="simlib-agent")
        self._agent.start()
        threading.Thread(target=accept, daemon=True, name="simlib-accept").start()
        try:
            self._await_workers()
        except BaseException:
            listener.close()  # workers still starting cannot connect, so they exit (none is known to kill yet)
            self._kill()
            raise
        if self.max_restarts == 0:  # no worker will read the spec again: the connection key leaves the disk now
            with contextlib.suppress(OSError):
                os.remove(spec_file)
        self.last_start_seconds = time.perf_counter() - t0

    def _await_workers(self) -> None:
        """Wait until ``world_size`` (new) workers have connected and joined the process group."""
        q, ready = self._queue, set()
        deadline, waited, extended = time.monotonic() + self.start_timeout, self.start_timeout, False
        while len(ready) < self.world_size:
            if self._stash:
                msg = self._stash.pop(0)
            else:
                try:
                    msg = q.get(timeout=0.05)
                except queue.Empty:
                    if time.monotonic() > deadline:
                        now = pace.pace(refresh=True)  # the limit tripped: how busy is the machine?
                        if now.busy and not extended:  # once, a longer wait, said; a busy laptop is no failure
                            more = pace.scaled(self.start_timeout, now)
                            print(
                                f"simlib: the {self.world_size} workers have not started within {waited:.0f} s; your "
                                f"machine is busy ({now.note()}): waiting {more:.0f} s more",
                                file=sys.stderr,
                                flush=True,
                            )
                            deadline, waited, extended = deadline + more, waited + more, True
                            continue
                        raise WorkerTimeout(
                            f"the {self.world_size} workers did not start within {waited:.0f} s"
                        ) from None
                    continue
            kind = msg[0]
            if kind == "conn":
                conn = msg[1]
                hello = frame_loads(conn.recv_bytes())
                rank = hello[1]
                self.attempt = hello[3] if len(hello) > 3 else 0
                self._conns[rank], self._pids[rank] = Channel(conn), hello[2]
                self._exit_pids[rank] = hello[4] if len(hello) > 4 else hello[2]
                threading.Thread(target=_read, args=(q, rank, conn), daemon=True, name=f"simlib-read-{rank}").start()
            elif kind == "ready" and msg[1] in self._conns:
                ready.add(msg[1])
            elif kind == "fatal":
                failure = msg[2]
                raise WorkerError(
                    f"rank {msg[1]} could not join the process group: "
                    f"{failure.type_name}: {failure.message}\n{failure.traceback}",
                    {msg[1]: failure},
                )
            elif kind == "out":
                self._print(msg)
            elif kind == "agent-exit":
                raise self._start_failure(self._agent_error, self._late_messages())
        agent = _agents.get(getattr(self, "_run_id", None))
        self._known_pcontext = getattr(agent, "_pcontext", None)  # whose workers these are (see _kill_workers)

    @property
    def _agent_error(self):
        """What the agent raised when it ended (its ChildFailedError names each worker's exit code), or None."""
        errors = getattr(self, "_agent_errors", None)
        return errors[0] if errors else None

    def _late_messages(self, wait: float = 1.0) -> list:
        """Messages still on their way when the agent ended (a worker's "fatal" races the agent's exit)."""
        late, deadline = [], time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                late.append(self._queue.get(timeout=0.05))
            except queue.Empty:
                if late:
                    break
        return late

    def _start_failure(self, error, late=()) -> WorkerError:
        """One short message for workers that ended while starting: rank, exit code, the last lines they wrote."""
        failures = getattr(error, "failures", None) or {}
        lines, by_rank = [], {}
        for msg in late:  # a worker that could not join the process group said why before it ended
            if msg[0] == "fatal":
                f = msg[2]
                by_rank[msg[1]] = f
                lines.append(f"rank {msg[1]} could not join the process group: {f.type_name}: {f.message}")
            elif msg[0] == "out":
                self._print(msg)
        first = [r for r, f in sorted(failures.items()) if (getattr(f, "exitcode", None) or 0) > 0]
        for rank, failure in sorted(failures.items()):
            code = getattr(failure, "exitcode", None)
            how = f"exit code {code}" if code is None or code >= 0 else f"signal {signal.Signals(-code).name}"
            if code == -signal.SIGTERM and first:  # the agent stops the others when one rank fails
                how += f", stopped by the agent when rank {first[0]} failed"
            tail = _last_lines(self._log_dir, getattr(failure, "local_rank", rank))
            by_rank[rank] = RemoteFailure(rank, "StartupError", f"ended while starting ({how})", tail)
            lines.append(f"rank {rank} ended while starting ({how})" + (":\n" + _indent(tail) if tail else ""))
        if not lines and error is not None:
            lines.append(f"{type(error).__name__}: {error}")
        if not lines:  # the agent ended without a failure: every worker exited (code 0) before joining
            tails = {r: _last_lines(self._log_dir, r) for r in range(self.world_size)}
            lines.append(
                "the elastic agent ended without reporting a failure: the workers exited before they "
                "joined (their connection to this process closed, or they were stopped from outside)"
                + "".join(f"\n  rank {r} wrote:\n{_indent(t)}" for r, t in tails.items() if t)
            )
        return WorkerError(f"the {self.world_size} workers could not start:\n" + "\n".join(lines), by_rank)

    def _exit_code(self, rank, wait: float = 10.0):
        """A dead worker's exit code (negative: the signal), peeked without reaping it (the agent reaps). The
        worker's connection closes as it dies; its launcher exits as it did only after the zygote has reaped it
        and told it (simlib.launcher): under a heavy load that takes seconds, hence the wait (only for a death)."""
        pid = getattr(self, "_exit_pids", {}).get(rank, self._pids.get(rank))  # the agent's child: the launcher
        deadline = time.monotonic() + wait
        while pid is not None and hasattr(os, "waitid"):
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except (ChildProcessError, OSError):  # already reaped by the agent, or not our child
                break
            if info is not None:
                return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if self._agent is not None:  # reaped by the agent: it reports the status when it ends, right after
            self._agent.join(2.0)
        failures = getattr(self._agent_error, "failures", None) or {}  # the agent's ChildFailedError
        failure = failures.get(rank)
        return getattr(failure, "exitcode", None)

    def _kill(self, wait: float = 15.0) -> None:
        """Stop every worker now (SIGKILL to each worker's process group) and wait up to ``wait`` s for the agent
        (a daemon thread: if it is slow to notice, the caller goes on and the next call starts a new one)."""
        _no_more_restarts(getattr(self, "_run_id", None))
        self._kill_workers()
        self._finish(wait)

    def _kill_workers(self, restarting: bool = False) -> None:
        # the agent's children too: a worker still starting (not yet known here by its hello) ends with them
        # (a forked worker when its launcher goes, simlib.zygote; otherwise it is the agent's child itself).
        # ``restarting``: stop the failed attempt's workers only. The agent may already have started the next
        # attempt's (a forked start takes milliseconds): its children are then those, and killing them left the
        # call to run again on dead workers ("restarted in 0.0 s", then every rank killed by SIGKILL).
        agent = _agents.get(getattr(self, "_run_id", None))
        try:
            started = list(agent._pcontext.pids().values()) if agent is not None and agent._pcontext else []
            if restarting and agent._pcontext is not getattr(self, "_known_pcontext", None):
                started = []
        except Exception:  # noqa: BLE001 - the agent's internals: best effort, the known workers follow
            started = []
        for pid in list(self._pids.values()) + started:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                    break
                except (ProcessLookupError, PermissionError, OSError):
                    continue

    def _drop_connections(self) -> None:
        """Close the channels to the current workers and forget them (their PIDs too)."""
        for chan in self._conns.values():
            try:
                chan.conn.close()
            except OSError:
                pass
        self._conns, self._pids = {}, {}

    def _finish(self, wait: float = 15.0) -> None:
        if self._agent is not None:
            self._agent.join(wait)
        self._drop_connections()
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.close()
            self._listener = None
        _agents.pop(getattr(self, "_run_id", None), None)
        shutil.rmtree(getattr(self, "_log_dir", ""), ignore_errors=True)
        self._closed = True
