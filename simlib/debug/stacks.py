"""Where a silent rank is now: its Python stack, dumped on a signal (the hang finder's other half).

A rank that never reached a collective is busy somewhere else (a loop that does not end, a wait on a file, a
sleep): its collective log only says what it did *last*. :func:`install` registers :mod:`faulthandler` on
``SIGUSR2`` in every worker (it writes every thread's stack from C, so it answers even while the rank is inside
a C call); before the caller stops a silent rank it sends the signal, reads what was written (:func:`take`) and
names the innermost frame of the rank's main thread that is the learner's (:func:`where`): ``hang.py:8 in stuck``.
POSIX only (Windows has no ``SIGUSR2``): there, :func:`take` returns None and the report says what it said before.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sysconfig
import threading
import time

SIGNAL = getattr(signal, "SIGUSR2", None)
_HEADER = "simlib main thread 0x%016x\n"
_files: list = []  # keep the registered file open for the life of the process

_TORCH_DIR = None
_SIMLIB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_SITE_DIRS = tuple(
    os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)


def install(path: str) -> bool:
    """In a worker: on ``SIGUSR2``, append every thread's stack to ``path`` (after a line naming the main
    thread). Returns False where the platform has no such signal."""
    if SIGNAL is None:
        return False
    f = open(path, "w", buffering=1)  # a restarted worker starts the file again: the header names its thread
    f.write(_HEADER % threading.main_thread().ident)
    f.flush()
    faulthandler.register(SIGNAL, file=f, all_threads=True, chain=False)
    while _files:  # an earlier registration's file (install called again)
        _files.pop().close()
    _files.append(f)
    return True


def take(pid: int | None, path: str, wait: float = 1.0) -> str | None:
    """Signal ``pid`` and return the stack dump it appended to ``path`` (None: no such file, no such process,
    no signal on this platform, or nothing written within ``wait`` seconds, e.g. a paused process)."""
    if SIGNAL is None or pid is None or not os.path.exists(path):
        return None
    start = os.path.getsize(path)
    try:
        os.kill(pid, SIGNAL)
    except OSError:
        return None
    deadline, size, since = time.monotonic() + wait, start, time.monotonic()
    while time.monotonic() < deadline:  # faulthandler writes in a burst: wait until it has grown, then settled
        time.sleep(0.02)
        now = os.path.getsize(path)
        if now != size:
            size, since = now, time.monotonic()
        elif size > start and time.monotonic() - since > 0.06:
            break
    if size == start:
        return None
    with open(path) as f:
        head = f.readline()
        f.seek(start)
        return head + f.read()


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)', re.M)


def main_frames(text: str) -> list[tuple[str, int, str]]:
    """The main thread's frames in a dump, innermost first (the thread named by the header, else the current)."""
    ident = re.match(r"simlib main thread (0x[0-9a-f]+)", text)
    blocks = [(m.group(1), m.start()) for m in _THREAD.finditer(text)]
    chosen = None
    for i, (tid, start) in enumerate(blocks):
        end = blocks[i + 1][1] if i + 1 < len(blocks) else len(text)
        if (ident and int(tid, 16) == int(ident.group(1), 16)) or (
            chosen is None and text[start:].startswith("Current")
        ):
            chosen = text[start:end]
    if chosen is None and blocks:
        chosen = text[blocks[0][1] :]
    return [(f, int(n), fn) for f, n, fn in _FRAME.findall(chosen or "")]


def _library(filename: str) -> bool:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith((_TORCH_DIR, _SIMLIB_DIR)):
        return True
    return path.startswith(_STDLIB_DIR) and not path.startswith(_SITE_DIRS)


def where(text: str | None) -> str | None:
    """``file:line:function`` of the innermost frame of the main thread outside torch, simlib and the standard
    library (the innermost frame of all if every one is a library's); None without a readable dump."""
    frames = main_frames(text or "")
    if not frames:
        return None
    mine = next((f for f in frames if not _library(f[0])), frames[0])
    return f"{mine[0]}:{mine[1]}:{mine[2]}"
