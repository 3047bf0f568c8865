"""What a failed distributed call raises in the caller, and remote tracebacks made readable."""

from __future__ import annotations

import linecache
import os
import re
import sys
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
    def from_exception(cls, rank: int, exc: BaseException) -> RemoteFailure:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(rank, type(exc).__name__, str(exc), tb)

    def summary(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"rank {self.rank}: {self.type_name}: {first}" if first else f"rank {self.rank}: {self.type_name}"


_SIGNAL_CAUSES = {
    "SIGSEGV": "a segmentation fault: a crash in native code, a C/C++ extension or a bad memory access",
    "SIGKILL": "often the out-of-memory killer, which `dmesg` names, or someone ran kill -9",
    "SIGABRT": "an abort, e.g. a failed assertion in native code",
    "SIGBUS": "a bus error: a crash in native code, often with memory-mapped files or shared memory",
    "SIGFPE": "an arithmetic fault in native code",
    "SIGTERM": "asked to stop by another process",
}


def describe_exit(exitcode: int | None) -> str:
    """Why a worker process ended, from its exit code (negative: killed by that signal, as in subprocess).

    >>> describe_exit(-11)
    'killed by SIGSEGV (a segmentation fault: a crash in native code, a C/C++ extension or a bad memory access)'
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

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the caller-side frames (simlib's own): what failed, then the ranks'
        tracebacks in the learner's terms (``Cell In[n], line k``)."""
        return [f"{type(self).__name__}: {self}"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or the kernel's interrupt button) stopped a launch or a call; every worker was stopped."""

    def _render_traceback_(self) -> list[str]:
        return ["KeyboardInterrupt"]  # simlib has already said what it stopped, in one line


class WorkerTimeout(WorkerError, TimeoutError):
    """A call did not finish in time (a hang, a deadlock or a mismatched collective) - or the machine was too busy
    for the limit: the message says the load measured when it tripped (:mod:`simlib.pace`), first when busy."""

    def __init__(self, message: str, failures: dict[int, RemoteFailure] | None = None, results=None):
        if "your machine is busy now (" not in message and " cores now: not busy)" not in message:
            from .pace import pace

            now = pace(max_age=30)
            first, nl, rest = message.partition("\n")
            if now.busy:
                first = f"your machine is busy now ({now.note()}), so a limit can trip on a right answer: {first}"
            else:
                first = f"{first} (load {now.load:.1f} on {now.cores} cores now: not busy)"
            message = first + nl + rest
        super().__init__(message, failures, results)


_DYNAMIC = re.compile(r'File "<dynamic-code>", line (\d+), in (\S+)')


def code_objects(fn, seen=None):
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
                yield from code_objects(other, seen)
    for cell in getattr(fn, "__closure__", None) or ():  # functions it captures (a helper defined beside it)
        try:
            other = cell.cell_contents
        except ValueError:
            continue
        if callable(other) and hasattr(other, "__code__"):
            yield from code_objects(other, seen)


def restore_filenames(text: str, fn) -> str:
    """cloudpickle renames the file of code shipped by value to ``<dynamic-code>``; put the real file
    (a notebook cell, a script) and its source line back into a remote traceback."""
    if "<dynamic-code>" not in text:
        return text
    files = {}
    for code in code_objects(fn):
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


_SIMLIB = os.path.dirname(os.path.abspath(__file__))
_PLUMBING = {
    os.path.join(_SIMLIB, name)  # __init__.py: its _in_rank hands a distributed cell to magic.py
    for name in ("worker.py", "magic.py", "__init__.py", os.path.join("debug", "hangs.py"))
}
_FRAME = re.compile(r'^  File "([^"]+)", line (\d+)(.*)$')


def cell_name(filename: str) -> str | None:
    """``Cell In[n]`` for a notebook cell's file (as IPython numbers it), else None."""
    if "IPython" not in sys.modules:
        return None
    try:
        ip = sys.modules["IPython"].get_ipython()
        label = ip.compile.format_code_name(filename) if ip is not None else None
    except Exception:  # noqa: BLE001 - not in IPython, or an older one
        return None
    return f"{label[0]} {label[1]}" if label else None


def learner_traceback(text: str) -> str:
    """A remote traceback in the learner's terms: simlib's own plumbing frames (the worker loop that called
    the learner's function) dropped, notebook cells named as IPython names them (``Cell In[3], line 4``), and
    source lines the worker could not read (a cell exists only in the kernel) filled in from here."""
    out, skip = [], False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            skip = os.path.abspath(m.group(1)) in _PLUMBING
            if not skip:
                filename, lineno = m.group(1), int(m.group(2))
                cell = cell_name(filename)
                if cell:
                    line = f"  {cell}, line {lineno}{m.group(3)}"
                out.append(line)
                has_source = i + 1 < len(lines) and lines[i + 1].startswith("    ")
                source = linecache.getline(filename, lineno).strip()
                if not has_source and source:
                    out.append(f"    {source}")
                continue
        elif not line.startswith("    "):
            skip = False
        if not skip:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def unpicklable(fn, args, kwargs, error: Exception) -> str:
    """Say which object that ``fn`` captures (or which argument) cannot travel to the workers, and what to do."""
    import cloudpickle

    candidates = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                candidates.append((f"the variable `{name}` it captures", cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        names, stack = set(), [code]
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_code"))
        glob = getattr(fn, "__globals__", {})
        candidates += [(f"the global `{n}` it uses", glob[n]) for n in sorted(names) if n in glob]
    candidates += [(f"argument {i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument `{k}`", v) for k, v in kwargs.items()]
    name = getattr(fn, "__qualname__", repr(fn))
    for what, value in candidates:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            return (
                f"cannot send `{name}` to the workers: {what} (a {type(value).__name__}) cannot be pickled "
                f"({type(exc).__name__}: {exc}). Each worker is a separate process: create such objects "
                "inside the function, on each rank, or pass plain values (numbers, tensors, dicts) as arguments."
            )
    return (
        f"cannot send `{name}` and its arguments to the workers: {type(error).__name__}: {error}. Each worker "
        "is a separate process: create unpicklable objects (locks, open files, clusters) inside the function."
    )


def died_first(err: WorkerError) -> list[int]:
    """The ranks whose process died on its own (killed, crashed): the cause of their peers' errors (a peer's lost
    connection, a rank the agent stopped with SIGTERM after), so a one-line summary leads with them."""
    failures = getattr(err, "failures", None) or {}
    return sorted(
        r for r, f in failures.items() if f.type_name == "WorkerDied" and not f.message.startswith("killed by SIGTERM")
    )


def _cause(err: WorkerError) -> str:
    """One line: which rank(s) failed and why (a rank that died first; its peers' lost-connection errors after)."""
    fails = [err.failures[r] for r in sorted(err.failures)]
    # a rank the agent stopped with SIGTERM because another died is a consequence, not a cause: the cause first
    died = died_first(err)
    stopped = [f for f in fails if f.type_name == "WorkerDied" and f.rank not in died]
    first = " first" if len(fails) > 1 else ""  # as the error's own first line says: "rank 0 died first; then 1"
    parts = [
        f"rank {f.rank} died{first}, {f.message}"
        if f.message.startswith("killed by")
        else f"rank {f.rank} died{first} ({f.message})"
        for f in fails
        if f.rank in died
    ]
    parts += [f"rank {f.rank} then stopped (SIGTERM)" if died else f"rank {f.rank} died, {f.message}" for f in stopped]
    for f in fails:
        if f.type_name != "WorkerDied":
            why = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", f.summary().split(": ", 1)[1])  # Gloo's file:line
            if len(why) > 90:  # the first sentence is enough here; the error at the end has the whole text
                why = why.split(". ")[0] + "." if len(why.split(". ")[0]) <= 90 else why[:87] + "..."
            parts.append(f"rank {f.rank} then failed: {why}" if died else f"rank {f.rank} failed: {why}")
    return ("; ".join(parts) or str(err).splitlines()[0]).rstrip(".")  # the caller ends the sentence


def _exhausted(attempts: list, max_restarts: int) -> WorkerError:
    """The error once every restart is spent: every attempt's cause, then the last attempt's detail."""
    lines = [f"attempt {i + 1}: {_cause(e)}" for i, e in enumerate(attempts)]
    last = attempts[-1]
    text = (
        f"failed on all {len(attempts)} attempts (max_restarts={max_restarts} spent):\n"
        + "\n".join(lines)
        + "\n--- last attempt ---\n"
        + str(last)
    )
    error = type(last)(text, last.failures, last.results)
    error.attempts = attempts
    return error
