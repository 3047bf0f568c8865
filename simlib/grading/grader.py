"""The :class:`Grader`: runs an exercise's harnesses on warm clusters (one per world size) with a time limit that
scales with the machine's load and one retry before "hang" (:mod:`simlib.grading.busy`), and the warm clusters
themselves (:func:`cluster`, :func:`close`)."""

from __future__ import annotations

import warnings

from .failures import _BROKE, _NOT_PLAIN, _UNSENDABLE, _broke_hint, _first_failure, _primary
from .results import _TODO_HINT, _TODO_NAME, ERROR, HANG, TODO, Result, _Enough, _last_line, _not_implemented, _Stop
from .sent import _guarded, _probe


class Grader:
    """Runs harnesses for an exercise on warm clusters (one per world size), with a time limit.

    Every check starts from healthy workers: the first run on each world size probes its cluster (process
    group up, a barrier) and restarts it when a learner's earlier code broke it.
    """

    def __init__(
        self, clusters: dict | None = None, timeout: float = 30.0, first_failure: bool = False, unanswered: bool = False
    ):
        self.clusters = clusters or {}
        self.timeout = timeout  # on a quiet machine; each run's limit is scaled by the machine's load (busy.py)
        self.probed = set()
        self.first_failure, self.failed = first_failure, False
        self.unanswered = unanswered  # no answer at all: a run is "not implemented yet", and no cluster starts
        self.busy_notes: list = []  # "your machine was busy ..." for every run that needed its second chance
        self.wire_last = None  # what the last metered run sent between ranks (simlib.grading.wire)
        self._wire_after = None  # (pids, reading) after the last run, when it was metered
        self.pieces_from = None  # a pieces milestone's answer (bytes): its re-runs train with its pieces
        self.second_chance = True  # False while a failure's instance is shrunk (instances.shrink): no retry

    def cluster(self, world_size: int):
        c = self.clusters.get(world_size) or cluster(world_size)
        if world_size not in self.probed:
            self.probed.add(world_size)
            self.ensure_healthy(c)
        return c

    @staticmethod
    def ensure_healthy(c) -> None:
        from ..launch import WorkerError

        try:
            c.call(_probe, timeout=10.0, plain=True)
        except WorkerError:
            c.restart()

    def run(self, world_size: int, harness, *args, what: str | None = None, wire: bool = False, **kwargs) -> list:
        """``harness(*args, **kwargs)`` on every rank -> per-rank results; a failure ends the exercise.
        ``wire``: also read what the ranks sent each other from the kernel's TCP counters, here, outside the
        workers (:mod:`simlib.grading.wire`) into ``self.wire_last`` ({(src, dst): [bytes, segments]}; None where
        it cannot be read)."""
        import time

        from ..launch import WorkerError, WorkerTimeout
        from .busy import Load, limit_for

        what = what or f"your code on {world_size} ranks"
        if self.unanswered:
            raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT))
        if self.first_failure and self.failed:
            raise _Enough
        cluster_ = self.cluster(world_size)
        self.wire_last = None
        if not wire:
            self._wire_after = None  # this run sends what it sends: the next metered one reads afresh
        if wire:
            return self._metered(cluster_, world_size, harness, args, kwargs, what)
        load = Load.now(world_size)  # the machine as it is at this moment: the limit scales with it
        limit = limit_for(self.timeout, load)
        t0 = time.monotonic()
        try:
            try:
                return cluster_.call(_guarded, (harness, args, kwargs), timeout=limit, plain=True)
            except WorkerTimeout as first:
                broke = _primary([f for f in first.failures.values() if f.type_name != "Timeout"])
                if (broke is not None and broke.type_name in _BROKE) or not self.second_chance:
                    raise
                # a second chance before the word "hang": the machine re-measured, a longer limit (issue 51)
                load = Load.now(world_size, refresh=True)
                limit = limit_for(self.timeout, load, retry=True)
                self.busy_notes.append(load.sentence(limit))
                t0 = time.monotonic()
                return cluster_.call(_guarded, (harness, args, kwargs), timeout=limit, plain=True)
        except WorkerTimeout as exc:
            broke = _primary([f for f in exc.failures.values() if f.type_name != "Timeout"])
            if broke is not None and broke.type_name in _BROKE:
                detail, hint = _broke_hint(broke)
                raise _Stop(Result(f"{what} finished", False, status=ERROR, detail=detail, hint=hint)) from None
            elapsed = time.monotonic() - t0
            why = (
                f"no answer within {limit:g} s (retried once after {load.sentence(limit)})"
                if exc.failures and all(f.type_name == "Timeout" for f in exc.failures.values())
                else f"a send/recv or collective waited longer than {cluster_.timeout:g} s for its peer"
            )
            raise _Stop(
                Result(
                    f"{what} finished",
                    False,
                    status=HANG,
                    detail=f"stopped after {elapsed:.0f} s: {why} (a hang or a deadlock)",
                    hint="every send needs a matching recv on the other rank, and every rank must "
                    "call the same collectives in the same order. A blocking send on every rank "
                    "at once can deadlock: post isend/irecv first, then wait. (The workers were "
                    "restarted.)\n" + _first_failure(exc),
                )
            ) from None
        except WorkerError as exc:
            failures = list(exc.failures.values())
            if failures and all(_not_implemented(f.type_name) for f in failures):
                raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT)) from None
            todo = [f for f in failures if _not_implemented(f.type_name)]
            if todo:
                raise _Stop(Result(_TODO_NAME, False, status=TODO, hint=_TODO_HINT)) from None
            failure = _primary(failures)
            if failure is not None and failure.type_name in _NOT_PLAIN:
                raise _Stop(
                    Result(
                        f"{what} sent back only plain data",
                        False,
                        status=ERROR,
                        detail=failure.summary(),
                        hint="the grader reads back from its workers only plain data of exact types "
                        "(numbers, strings, lists, dicts, plain tensors): return those, not your "
                        "own classes or subclasses of them",
                    )
                ) from None
            if failure is not None and failure.type_name in _BROKE:  # the cluster restarts on its next call
                detail, hint = _broke_hint(failure)
                raise _Stop(
                    Result(f"{what} ran without breaking its worker", False, status=ERROR, detail=detail, hint=hint)
                ) from None
            detail = failure.summary() if failure else str(exc).splitlines()[0]
            raise _Stop(
                Result(
                    f"{what} ran without an exception",
                    False,
                    status=ERROR,
                    detail=detail,
                    hint=_last_line(failure.traceback) if failure else "",
                )
            ) from None
        except (TypeError, AttributeError, ValueError) as exc:  # cloudpickle could not send the answer
            if "pickle" in str(exc).lower() or "serializ" in str(exc).lower():
                raise _Stop(
                    Result(
                        "your code can be sent to the workers", False, status=ERROR, detail=str(exc), hint=_UNSENDABLE
                    )
                ) from None
            raise

    def _metered(self, cluster_, world_size, harness, args, kwargs, what) -> list:
        from . import wire as _wire

        pids, retries = list(cluster_.pids), len(self.busy_notes)
        last = self._wire_after  # the reading after the previous run, when it was metered on these workers
        before = last[1] if last and last[0] == pids else _wire.snapshot(pids) if _wire.available() else None
        self._wire_after = None
        outs = self.run(world_size, harness, *args, what=what, **kwargs)
        # a restarted cluster has other sockets, and a run that needed its second chance (a busy machine) sent part
        # of its bytes twice: no reading
        if before is not None and list(cluster_.pids) == pids and len(self.busy_notes) == retries:
            after = _wire.snapshot(pids)
            self.wire_last = _wire.between(before, after, pids)
            self._wire_after = (pids, after)  # between two runs nothing crosses: the next metered run starts here
        return outs

    def ask(self, harness, *args, what: str | None = None):
        """``harness(*args)`` on a one-process worker -> its plain result: what a check needs to know of the answer
        (its type, what it returns) is computed there, never in this process. For an unanswered exercise (no
        answer at all) it is None, and no worker starts: the check says "not done yet" in its own words."""
        if self.unanswered:
            return None
        return self.run(1, harness, *args, what=what or "your code")[0]


_clusters: dict = {}


def cluster(world_size: int, timeout: float = 10.0):
    """A warm cluster of ``world_size`` ranks kept for the checks (collectives time out after ``timeout`` s)."""
    from ..launch import Cluster, OversubscribedWarning
    from .busy import Load, limit_for

    if world_size not in _clusters:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscribedWarning)
            # a peer's wait scales with the machine's load too: a busy peer is late, not gone
            _clusters[world_size] = Cluster(
                world_size, timeout=limit_for(timeout, Load.now(world_size)), threads=1, grace=2.0
            )
    return _clusters[world_size]


def close() -> None:
    """Stop the grader's clusters (the last cell of an exercise notebook calls it)."""
    for c in list(_clusters.values()):
        c.close()
    _clusters.clear()
