"""Which rank's failure says what the learner's code did (:func:`_primary`), and the hint for code that broke its
worker or the process group (:func:`_broke_hint`)."""

from __future__ import annotations

_ECHO = (
    "connection closed",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "peer",
    "socket",
    "default process group has not been initialized",
)


def _primary(failures):
    """The failure that says what the learner's code did, on the rank that did it (not another rank's echo)."""

    def rank_of(f):
        if f.type_name == "ProcessGroupBroken":
            return 0
        if f.type_name == "WorkerDied" and "SIGTERM" not in f.message and "without reporting" not in f.message:
            return 1  # a known cause; SIGTERM or no status: most likely stopped after another rank's death
        if f.type_name == "SystemExit":
            return 2
        if f.type_name == "WorkerDied":
            return 5 if "SIGTERM" in f.message else 4  # SIGTERM: the agent stops the others after a death
        if any(word in f.message.lower() for word in _ECHO) or f.type_name in ("DistBackendError", "Timeout"):
            return 6
        return 3

    order = {id(f): i for i, f in enumerate(failures)}  # the order they arrived in: the first death is the cause
    return min(failures, key=lambda f: (rank_of(f), order[id(f)])) if failures else None


_BROKE = ("ProcessGroupBroken", "SystemExit", "WorkerDied")
_NOT_PLAIN = ("NotPlain", "Refused")  # a worker sent back something the grader does not read (simlib.plain)
_UNSENDABLE = (
    "the workers receive your function or class by value: it must not hold an open cluster, file or "
    "lock. Define what it needs inside the cell."
)


def _broke_hint(failure) -> tuple[str, str]:
    """(detail, hint) for a learner's code that broke its worker or the process group."""
    shared = (
        "the grader's workers are shared by every check: leave the process group to the grader and let "
        "your function return. (The workers were restarted.)"
    )
    if failure.type_name == "ProcessGroupBroken":
        return (
            f"rank {failure.rank}: your code {failure.message}",
            f"your code {failure.message} on rank {failure.rank}: " + shared,
        )
    if failure.type_name == "SystemExit":
        return (
            f"rank {failure.rank}: your code called sys.exit()",
            f"your code called sys.exit() (or exit()) on rank {failure.rank}: return a value instead. " + shared,
        )
    if "SIGABRT" in failure.message:  # Gloo aborts when a send and its recv disagree on the size
        return (
            f"rank {failure.rank}: the worker process ended: {failure.message}",
            f"rank {failure.rank}'s worker process was aborted while running your code: Gloo aborts a process "
            "when a send and the matching recv disagree on the message size (or a collective's tensors differ "
            "across ranks). Both sides of each send/recv must agree on every chunk's length; print them per "
            "rank and step. (The workers were restarted.)",
        )
    return (
        f"rank {failure.rank}: the worker process ended: {failure.message}",
        f"rank {failure.rank}'s worker process ended while running your code ({failure.message}). Did your "
        "code call os._exit(), kill the process, or crash native code (a segfault)? " + shared,
    )


def _first_failure(exc) -> str:
    for f in sorted(getattr(exc, "failures", {}).values(), key=lambda f: f.rank):
        if f.type_name != "Timeout":
            return f"first report: {f.summary()}"
    return ""
