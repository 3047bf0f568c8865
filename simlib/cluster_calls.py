"""One call on a :class:`simlib.warm_cluster.Cluster`'s workers: sent to every rank, waited for with a time limit,
each rank's result read (``plain=True``: as plain data only), and when a rank fails, the error that names it.

Failure rules: an exception on a rank is raised here as :class:`WorkerError` naming the rank(s); ranks that do not
finish within ``grace`` seconds of the first failure are stopped (and the cluster restarts on its next call); a call
past its time limit is a :class:`WorkerTimeout` naming the silent ranks and what their processes are doing; the
hang finder (plugged in through :mod:`simlib.hooks`) adds the first collective where the ranks' sequences part.
After a failure with ``max_restarts`` left, every worker is restarted and the call runs again.
"""

from __future__ import annotations

import os
import queue
import sys
import time

import cloudpickle

from . import plain as _plain
from .errors import (
    Interrupted,
    RemoteFailure,
    WorkerError,
    WorkerTimeout,
    _cause,
    _exhausted,
    describe_exit,
    learner_traceback,
    restore_filenames,
    unpicklable,
)


def _check_positive(name, value, allow_none=True):
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return value


class Calls:
    """The calls of a cluster of warm workers (mixed into :class:`simlib.warm_cluster.Cluster`, which starts and
    stops them)."""

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
            print(
                f"simlib: started {self.world_size} fresh workers ({self.last_start_seconds:.1f} s) after {why}",
                flush=True,
            )
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
        print(
            f"simlib: {_cause(err)}. Restarting all {self.world_size} workers: restart {self.attempt + 1} of "
            f"max_restarts={self.max_restarts}",
            file=sys.stderr,
            flush=True,
        )
        self._kill_workers(
            restarting=True
        )  # the agent sees them fail, starts new ones (TORCHELASTIC_RESTART_COUNT + 1)
        self._drop_connections()
        try:
            self._await_workers()
        except BaseException:
            self._kill()
            self._broken = True
            raise
        print(
            f"simlib: {self.world_size} workers restarted in {time.perf_counter() - t0:.1f} s "
            f"(attempt {self.attempt + 1} of {self.max_restarts + 1}); running the call again",
            file=sys.stderr,
            flush=True,
        )

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
                    failures[rank] = RemoteFailure(
                        rank,
                        "WorkerDied",
                        "the worker process had ended before the call (killed, crashed, or it called os._exit)",
                        "",
                    )
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
                elif (
                    kind == "eof"
                    and msg[1] not in results
                    and msg[1] not in failures
                    and msg[1] in self._conns
                    and self._conns[msg[1]].conn is msg[2]
                ):
                    died.add(msg[1])
                    failures[msg[1]] = (
                        RemoteFailure(msg[1], "Refused", msg[3], "")
                        if len(msg) > 3
                        else RemoteFailure(msg[1], "WorkerDied", describe_exit(self._exit_code(msg[1])), "")
                    )
                    first_failure = first_failure or time.monotonic()
        except KeyboardInterrupt:  # the workers are SIGKILLed at once: the message need not wait long for the agent
            self._kill(wait=2.0)  # thread (a daemon) to notice; the next call starts a new agent
            self._broken = "the interrupt"
            print(
                f"simlib: interrupted; stopped all {self.world_size} workers (the next call starts fresh ones)",
                file=sys.stderr,
                flush=True,
            )
            raise Interrupted(f"stopped all {self.world_size} workers") from None  # one line in a notebook
        self._drain()
        if not failures and len(results) == self.world_size:
            return [results[r] for r in range(self.world_size)]
        raise self._fail(results, failures, died, timeout, first_failure, restartable) from None

    def _fail(self, results, failures, died, timeout, first_failure, restartable=False) -> WorkerError:
        pending = [r for r in range(self.world_size) if r not in results and r not in failures]
        if pending and first_failure is None:
            msg = (
                f"call timed out after {timeout:g} s: rank(s) {pending} did not finish "
                f"(ranks {sorted(results)} did). A hang or a collective that only some ranks called."
            )
            failures.update(
                {r: RemoteFailure(r, "Timeout", f"did not finish within {timeout:g} s", "") for r in pending}
            )
            error_type = WorkerTimeout
        else:
            died_first = sorted(
                r for r, f in failures.items() if f.type_name == "WorkerDied" and "SIGTERM" not in f.message
            )
            names = ", ".join(str(r) for r in died_first + sorted(set(failures) - set(died_first)))
            names = names.replace(",", " died first; then", 1) if died_first and len(failures) > 1 else names
            msg = f"{len(failures)} of {self.world_size} rank(s) failed (rank {names})"
            error_type = WorkerError
            if any("timed out" in f.message.lower() or "timeout" in f.message.lower() for f in failures.values()):
                error_type = WorkerTimeout
                msg += (
                    f". A collective waited longer than timeout={self.timeout:g} s for its peers: "
                    "usually a collective (or send/recv) that not every rank called, or called in a "
                    "different order"
                )
            if pending:
                silent = "; ".join(f"rank {r} {self._why_silent(r)}" for r in pending)
                if error_type is WorkerTimeout:  # the silent rank is the cause: name it first
                    msg = (
                        f"rank(s) {pending} did not answer ({silent}): rank(s) {sorted(failures)} timed out "
                        f"waiting for them after timeout={self.timeout:g} s. The silent rank(s) were stopped"
                    )
                else:
                    msg += (
                        f"; rank(s) {pending} never answered ({silent}) and were stopped {self.grace:g} s after "
                        "the first failure"
                    )
        # the cause first: a rank that died (not stopped by SIGTERM, which the agent sends to the others), then
        # the ranks that failed because it was gone
        by_rank = sorted(failures.values(), key=lambda f: (f.type_name != "WorkerDied", "SIGTERM" in f.message, f.rank))
        lines = [f.summary() for f in by_rank]
        from . import hooks

        hangs = hooks.tool("hang_finder")  # simlib.debug.hangs, plugged in by simlib.debug
        finder = hangs and hangs.failure_report(
            os.path.join(self._log_dir, "collectives") if self.hang_finder else None,
            self.world_size,
            results,
            failures,
            pending,
            error_type is WorkerTimeout,
            getattr(self, "_fn", None),
            {r: self._pids.get(r) for r in pending},
        )
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
        return {
            "T": "was stopped (SIGSTOP or Ctrl-Z: its process is paused)",
            "t": "was paused by a debugger",
            "Z": "had exited",
            "D": "was blocked in the kernel (disk or network I/O)",
        }.get(state, "was still running (a hang, or a collective it never reached)")

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
