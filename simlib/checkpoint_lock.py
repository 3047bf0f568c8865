"""One run per checkpoint folder: the run holds an ``flock`` on ``<folder>/.simlib-run.lock`` for its whole life.

Two runs saving into one folder would overwrite each other's checkpoints (a second ``simlib train`` without
``--resume`` once continued the first run's step, and the first died). :func:`claim` (every rank, at the start of
``train``) has rank 0 take the folder; ``simlib train`` takes it with :func:`hold` before it checks for an existing
checkpoint, so that check and the run happen under one lock, and its ranks count that lock as theirs. Re-exported
by :mod:`simlib.checkpoint`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint_files import CheckpointError, _rank, from_rank0

LOCK, _LOCK_ENV = ".simlib-run.lock", "SIMLIB_CHECKPOINT_LOCKS"
_holds: dict = {}  # folder -> [fd, count]: this process's locks (a second train() in it on the same folder: fine)


class Hold:
    """This process's claim on a checkpoint folder; released when closed or garbage-collected (or the process
    ends: the kernel drops an ``flock`` with its file)."""

    def __init__(self, key: str):
        self.key = key
        _holds[key][1] += 1

    def close(self) -> None:
        entry = _holds.get(self.key)
        if entry is not None and self.key:
            entry[1] -= 1
            if entry[1] <= 0:
                del _holds[self.key]
                os.close(entry[0])
        self.key = ""

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the module may be gone; the kernel drops the lock
            pass


def hold(directory, for_children: bool = False) -> Hold | None:
    """Take ``directory`` for this run: an exclusive ``flock`` on ``directory/.simlib-run.lock`` for as long as the
    returned :class:`Hold` lives. Raises :class:`CheckpointError` naming the holder when another run has it.
    ``for_children``: the processes this one starts from now on (``simlib train``'s ranks) count the lock as
    theirs (its token goes into the environment they inherit); a worker whose launcher holds it gets None."""
    import fcntl
    import secrets
    import socket
    import time

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    key = str(root.resolve())
    if key in _holds:
        return Hold(key)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}
        os.close(fd)
        if holder.get("token") and holder["token"] in os.environ.get(_LOCK_ENV, "").split(","):
            return None  # our own launcher holds it for this run
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
            if holder
            else "another process"
        )
        raise CheckpointError(
            f"checkpoint_dir {root} is in use by another run ({who}): two runs saving into one "
            "folder would overwrite each other's checkpoints; wait for that run to end, or give "
            "another checkpoint_dir (--out or --plan.checkpoint-dir)"
        ) from None
    token = secrets.token_hex(8)
    os.ftruncate(fd, 0)
    os.pwrite(
        fd,
        json.dumps(
            dict(pid=os.getpid(), host=socket.gethostname(), token=token, since=time.strftime("%Y-%m-%d %H:%M:%S"))
        ).encode(),
        0,
    )
    if for_children:
        os.environ[_LOCK_ENV] = ",".join(t for t in (os.environ.get(_LOCK_ENV), token) if t)
    _holds[key] = [fd, 0]
    return Hold(key)


def claim(directory) -> Hold | None:
    """Every rank calls it at the start of a run: rank 0 takes ``directory`` (:func:`hold`) for the run's life;
    the same one-line :class:`CheckpointError` on every rank when another run holds it."""
    held, problem = None, None
    if _rank() == 0:
        try:
            held = hold(directory)
        except CheckpointError as exc:
            problem = str(exc)
        except OSError:  # a folder that cannot be written: preflight (or the first save) says so in one line
            held = None
    problem = from_rank0(problem)
    if problem:
        raise CheckpointError(problem)
    return held
