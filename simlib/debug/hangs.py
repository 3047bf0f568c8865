"""The hang finder: which rank did not join the collective, and where the ranks' paths parted.

A distributed run hangs when the ranks do not call the same collectives in the same order: one rank skips an
``all_reduce``, or calls ``broadcast`` where its peers call ``all_reduce``, or passes a tensor of another shape.
Every rank then waits in a different place until the process group's timeout, and the error each rank gets
("Timed out waiting 20000ms for recv") says nothing about *why*. PyTorch's flight recorder keeps that history for
NCCL only; this module keeps it on any backend (Gloo included):

- :func:`install` wraps ``torch.distributed``'s collectives (``all_reduce``, ``broadcast``, ``all_gather``, ...,
  ``send``/``recv``) so that each call appends one line to this rank's log *before* it runs: operation, group,
  shape, dtype, root/peer and call site (the first frame outside torch, and the learner's frame if that is
  another). :class:`simlib.Cluster` installs it in every worker (on by default; the cost is a few microseconds per
  collective, measured in ``benchmarks/hang_finder.py``) and starts a fresh log at each call.
- :func:`diagnose` reads every rank's log after a failure and names the first collective where the sequences
  differ, per process group, and the rank that is behind::

      rank 1 called all_reduce(shape [1024], float32) at train.py:88 in step;
      rank 0 is in broadcast(shape [1024], float32, src 0) at train.py:91 in step

  ``Cluster`` appends this to the :class:`~simlib.WorkerTimeout` it raises (the ``WorkerError`` path too, when
  the sequences differ). A rank that never reached the call is busy elsewhere: before it is stopped it is asked for its
  Python stack (``faulthandler`` on ``SIGUSR2``, :mod:`simlib.debug.stacks`) and named with its last collective
  *and* where it is now (``then it was still running at hang.py:8 in stuck``). The reading half lives in
  :mod:`simlib.debug.divergence`; its functions are re-exported here.
- :func:`check` compares the ranks' sequences *without* a hang (an ``all_gather_object`` of the logs), for the
  desynchronisations that do not hang but silently mix up data (two buckets of different sizes reduced in a
  different order on each rank may still "work" on some backends).

Only calls through ``torch.distributed``'s Python functions are seen: DDP's C++ reducer and FSDP2's functional
collectives bypass them (the course's own DP, ZeRO, TP and PP go through them). Under torchrun or SLURM, call
``install(directory)`` after ``init_process_group`` and run ``python -m simlib.debug.hangs DIRECTORY`` after a hang.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import torch

from . import stacks
from .divergence import (  # noqa: F401 - the API
    _FIELDS,
    _P2P,
    _as_dict,
    describe_call,
    diagnose,
    failure_report,
    first_divergence,
    main,
    read,
    report,
    resolver,
)

_OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "_all_gather_base",
    "_reduce_scatter_base",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
)
_ROOTED = {
    "broadcast": "src",
    "reduce": "dst",
    "gather": "dst",
    "gather_object": "dst",
    "scatter": "src",
    "scatter_object_list": "src",
    "broadcast_object_list": "src",
}

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_SIMLIB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_THIS = os.path.abspath(__file__)


class _Log:
    """This rank's record of the current call: in memory, and one JSON line per collective in a file (so the
    caller can read it even when this rank is stuck or killed)."""

    def __init__(self, path: str | None, rank: int):
        self.path, self.rank = path, rank
        self.records: list[tuple] = []  # _FIELDS; text, so that the file holds the same
        self.group_seq: dict = {}
        self.file = open(path, "w", buffering=1) if path else None  # line-buffered: each line reaches the file
        self.local = threading.local()

    def restart(self) -> None:
        self.records.clear()
        self.group_seq.clear()
        if self.file is not None:
            self.file.seek(0)
            self.file.truncate()

    def add(self, record: tuple) -> None:
        self.records.append(record)
        if self.file is not None:  # one tab-separated line (json.dumps would cost several times more)
            self.file.write("\t".join(map(str, record)) + "\n")


_log: _Log | None = None
_originals: dict = {}
_group_names: dict = {}


def _group_key(group) -> str:
    """``"WORLD"`` or ``"ranks 0,2"`` (the group's global ranks): the same text on every member."""
    if group is None:
        return "WORLD"
    key = _group_names.get(id(group))
    if key is None:
        import torch.distributed as dist

        if group is dist.group.WORLD:
            key = "WORLD"
        else:
            try:
                key = "ranks " + ",".join(str(r) for r in dist.get_process_group_ranks(group))
            except (RuntimeError, ValueError):
                key = f"group {id(group):x}"
        _group_names[id(group)] = key
    return key


_DTYPES: dict = {}


def _describe(value):
    """Shape and dtype of a collective's payload, as text: a tensor (``[1024]``), a list of tensors
    (``2 x [1024]``) or objects."""
    if isinstance(value, torch.Tensor):
        dtype = _DTYPES.get(value.dtype)
        if dtype is None:
            dtype = _DTYPES[value.dtype] = str(value.dtype).replace("torch.", "")
        return str(list(value.shape)), dtype
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], torch.Tensor):
            shape, dtype = _describe(value[0])
            return f"{len(value)} x {shape}", dtype
        return f"{len(value)} objects", ""
    return "", ""


def _site(frame):
    """(call site, learner's site): the first frame outside torch and this file; the first outside simlib too."""
    site = user = None
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != _THIS:
            here = f"{name}:{frame.f_lineno}:{frame.f_code.co_name}"
            if site is None:
                site = here
            if not name.startswith(_SIMLIB_DIR):
                user = here
                break
        frame = frame.f_back
    return site, (user if user != site else None)


def _wrap(name: str, fn):
    import inspect

    params = list(inspect.signature(fn).parameters)
    pos = {p: params.index(p) for p in ("group", "src", "dst", "async_op") if p in params}
    root_name = _P2P.get(name) or _ROOTED.get(name)

    def arg(args, kwargs, p):
        if p in kwargs:
            return kwargs[p]
        i = pos.get(p)
        return args[i] if i is not None and i < len(args) else None

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        log = _log
        if log is None or getattr(log.local, "inside", False):  # a collective that another one calls: once
            return fn(*args, **kwargs)
        if name == "batch_isend_irecv":
            shape, dtype = f"{len(args[0]) if args else 0} ops", ""
        else:
            first = args[0] if args else next(iter(kwargs.values()), None)
            if name in ("all_gather", "all_gather_object", "gather_object") and len(args) > 1:
                first = args[1]  # the tensor this rank sends, not the list it receives into
            shape, dtype = ("", "") if name in ("all_gather_object", "gather_object") else _describe(first)  # any len
        group = _group_key(arg(args, kwargs, "group"))
        seq = log.group_seq[group] = log.group_seq.get(group, -1) + 1
        site, user = _site(sys._getframe(1))
        root = f"{root_name}={arg(args, kwargs, root_name)}" if root_name is not None else ""
        log.add(
            (
                len(log.records),
                name,
                group,
                seq,
                shape,
                dtype,
                site,
                user or "",
                root,
                bool(arg(args, kwargs, "async_op")),
                time.time(),
            )
        )
        log.local.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            log.local.inside = False

    recorded._simlib_original = fn
    return recorded


def install(directory: str | None = None, rank: int | None = None) -> None:
    """Record this rank's collectives from now on (idempotent); with ``directory``, also to
    ``directory/collectives-rank{rank}.tsv`` (what :func:`diagnose` reads after a hang)."""
    global _log
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    path = None
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"collectives-rank{rank}.tsv")
    if _log is not None and _log.file is not None:
        _log.file.close()
    _log = _Log(path, rank)
    if directory is not None:  # where a silent rank is, asked before it is stopped (simlib.debug.stacks)
        stacks.install(os.path.join(directory, f"stack-rank{rank}.txt"))
    for name in _OPS:
        fn = getattr(c10d, name, None)
        if fn is None or name in _originals:
            continue
        _originals[name] = fn
        wrapped = _wrap(name, fn)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)


def uninstall() -> None:
    """Put torch.distributed's own functions back."""
    global _log
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, fn in _originals.items():
        setattr(c10d, name, fn)
        if getattr(getattr(dist, name, None), "_simlib_original", None) is fn:
            setattr(dist, name, fn)
    _originals.clear()
    if _log is not None and _log.file is not None:
        _log.file.close()
    _log = None


def installed() -> bool:
    return _log is not None


def new_call() -> None:
    """Start a fresh log (the worker calls this before each call it runs)."""
    if _log is not None:
        _log.restart()


def history() -> list[dict]:
    """This rank's collectives since the current call began (a copy)."""
    return [_as_dict(map(str, r)) for r in _log.records] if _log is not None else []


def check(group=None) -> None:
    """Compare the ranks' collectives so far (collective itself: every rank must call it); raise a
    ``RuntimeError`` naming the first difference. For desynchronisations that do not hang."""
    import torch.distributed as dist

    mine = history()
    world = dist.get_world_size(group)
    everyone = [None] * world
    if _log is not None:  # the check's own all_gather_object stays out of the history
        _log.local.inside = True
    try:
        dist.all_gather_object(everyone, mine, group=group)
    finally:
        if _log is not None:
            _log.local.inside = False
    logs = dict(enumerate(everyone))
    if first_divergence(logs, world) is not None:
        raise RuntimeError(diagnose(logs, world))


if __name__ == "__main__":
    raise SystemExit(main())
