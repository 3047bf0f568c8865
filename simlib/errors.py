"""What a failed distributed call raises in the caller, and remote tracebacks made readable."""
from __future__ import annotations

import linecache
import re
import traceback
from dataclasses import dataclass


class OversubscribedWarning(UserWarning):
    """More workers than cores: they share cores, and timings show it."""


@dataclass
class RemoteFailure:
    """An exception raised on one rank, carried back as text (its type may not exist here)."""

    rank: int
    type_name: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, rank: int, exc: BaseException) -> "RemoteFailure":
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(rank, type(exc).__name__, str(exc), tb)

    def summary(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"rank {self.rank}: {self.type_name}: {first}" if first else f"rank {self.rank}: {self.type_name}"


_SIGNAL_CAUSES = {
    "SIGSEGV": "a segmentation fault: a crash in native code (C/C++ extension, bad memory access)",
    "SIGKILL": "often the out-of-memory killer (`dmesg` says); or someone ran kill -9",
    "SIGABRT": "an abort, e.g. a failed assertion in native code",
    "SIGBUS": "a bus error: a crash in native code (often memory-mapped files or shared memory)",
    "SIGFPE": "an arithmetic fault in native code",
    "SIGTERM": "asked to stop by another process",
}


def describe_exit(exitcode: int | None) -> str:
    """Why a worker process ended, from its exit code (negative: killed by that signal, as in subprocess).

    >>> describe_exit(-11)
    'killed by SIGSEGV (a segmentation fault: a crash in native code (C/C++ extension, bad memory access))'
    """
    import signal
    if exitcode is None:
        return "the worker process ended without reporting (killed, crashed, or it called os._exit)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = _SIGNAL_CAUSES.get(name)
        return f"killed by {name}" + (f" ({cause})" if cause else "")
    return f"the worker process exited with code {exitcode} without reporting (it called os._exit or sys.exit?)"


class WorkerError(RuntimeError):
    """One or more ranks failed. ``failures`` maps rank -> :class:`RemoteFailure`."""

    def __init__(self, message: str, failures: dict[int, RemoteFailure] | None = None, results=None):
        super().__init__(message)
        self.failures = failures or {}
        self.results = results or {}  # ranks that did finish, rank -> return value

    @property
    def ranks(self) -> list[int]:
        return sorted(self.failures)


class WorkerTimeout(WorkerError, TimeoutError):
    """A call did not finish in time (a hang, a deadlock or a mismatched collective)."""


_DYNAMIC = re.compile(r'File "<dynamic-code>", line (\d+), in (\S+)')


def _code_objects(fn, seen=None):
    """Code objects of ``fn``, of functions nested in it and of the module-level functions it calls."""
    seen = set() if seen is None else seen
    code = getattr(fn, "__code__", None)
    if code is None or id(code) in seen:
        return
    stack = [code]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        yield c
        stack.extend(k for k in c.co_consts if hasattr(k, "co_code"))
        for name in c.co_names:
            other = getattr(fn, "__globals__", {}).get(name)
            if callable(other) and hasattr(other, "__code__"):
                yield from _code_objects(other, seen)


def restore_filenames(text: str, fn) -> str:
    """cloudpickle renames the file of code shipped by value to ``<dynamic-code>``; put the real file
    (a notebook cell, a script) and its source line back into a remote traceback."""
    if "<dynamic-code>" not in text:
        return text
    files = {}
    for code in _code_objects(fn):
        files.setdefault(code.co_name, []).append(code)

    def fix(match):
        line, name = int(match.group(1)), match.group(2)
        for code in files.get(name, []):
            lines = [ln for _, _, ln in code.co_lines() if ln is not None]
            if lines and min(lines) <= line <= max(lines):
                source = linecache.getline(code.co_filename, line).strip()
                return f'File "{code.co_filename}", line {line}, in {name}' + (f"\n    {source}" if source else "")
        return match.group(0)

    return _DYNAMIC.sub(fix, text)
