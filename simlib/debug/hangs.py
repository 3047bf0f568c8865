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
  the sequences differ).
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
import re
import sys
import threading
import time

import torch

_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
        "all_gather_coalesced", "all_reduce_coalesced", "gather", "gather_object", "scatter", "scatter_object_list",
        "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
        "broadcast_object_list", "_all_gather_base", "_reduce_scatter_base",
        "send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv")
_P2P = {"send": "dst", "isend": "dst", "send_object_list": "dst", "recv": "src", "irecv": "src",
        "recv_object_list": "src"}
_ROOTED = {"broadcast": "src", "reduce": "dst", "gather": "dst", "gather_object": "dst", "scatter": "src",
           "scatter_object_list": "src", "broadcast_object_list": "src"}

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


_FIELDS = ("n", "op", "group", "seq", "shape", "dtype", "site", "user", "root", "async", "t")


def _as_dict(fields) -> dict:
    r = dict(zip(_FIELDS, fields))
    r["n"], r["seq"], r["t"] = int(r["n"]), int(r["seq"]), float(r["t"])
    for key in ("shape", "dtype", "user", "root"):
        if r[key] in ("", "None"):
            r[key] = None
    r["async"] = r["async"] == "True"
    root = r.pop("root")
    if root is not None:
        name, value = root.split("=", 1)
        r[name] = None if value == "None" else int(value)
    return r


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
        log.add((len(log.records), name, group, seq, shape, dtype, site, user or "", root,
                 bool(arg(args, kwargs, "async_op")), time.time()))
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


# ── reading the logs ──

def read(directory: str, world_size: int) -> dict[int, list[dict]]:
    """Every rank's log in ``directory`` (a rank with no file has an empty list; a half-written line is skipped)."""
    logs = {}
    for rank in range(world_size):
        records = []
        try:
            with open(os.path.join(directory, f"collectives-rank{rank}.tsv")) as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    if line.endswith("\n") and len(fields) == len(_FIELDS):  # skip a half-written last line
                        records.append(_as_dict(fields))
        except OSError:
            pass
        logs[rank] = records
    return logs


def _signature(r: dict) -> tuple:
    """What must agree across the ranks of a group for the k-th collective to match."""
    return (r["op"], r["shape"], r["dtype"], r.get("src"), r.get("dst"))


def _where(site: str | None, resolve) -> str:
    if not site:
        return "an unknown place"
    filename, line, func = site.rsplit(":", 2)
    if resolve is not None:
        filename = resolve(filename, int(line), func)
    label = filename if filename.startswith("Cell In") else os.path.basename(filename)
    return f"{label}:{line} in {func}"


def describe_call(r: dict, resolve=None) -> str:
    """``all_reduce(shape [1024], float32) at train.py:88 in step``."""
    parts = []
    if r.get("shape") is not None:
        parts.append(f"shape {r['shape']}" if r["shape"].startswith("[") else r["shape"])
    if r.get("dtype"):
        parts.append(r["dtype"])
    for key in ("src", "dst"):
        if r.get(key) is not None:
            parts.append(f"{key} {r[key]}")
    text = f"{r['op']}({', '.join(parts)}) at {_where(r.get('site'), resolve)}"
    if r.get("user"):
        text += f" (called from {_where(r['user'], resolve)})"
    return text


def _members(group: str, world_size: int, logs) -> list[int]:
    if group == "WORLD":
        return list(range(world_size))
    if group.startswith("ranks "):
        return [int(x) for x in group[6:].split(",")]
    return sorted(r for r, recs in logs.items() if any(x["group"] == group for x in recs))


def first_divergence(logs: dict[int, list[dict]], world_size: int) -> dict | None:
    """The earliest collective (over every group) at which the ranks' sequences differ, or None.

    Returns ``{"group", "seq", "calls": {rank: record or None}, "behind": [ranks with no such call]}``.
    Point-to-point operations (``send``/``recv``) are matched per pair of ranks instead of per group.
    """
    found = []
    groups = sorted({r["group"] for recs in logs.values() for r in recs if r["op"] not in _P2P})
    for group in groups:
        members = _members(group, world_size, logs)
        seqs = {m: [r for r in logs.get(m, []) if r["group"] == group and r["op"] not in _P2P] for m in members}
        longest = max(len(s) for s in seqs.values())
        for k in range(longest):
            calls = {m: (s[k] if k < len(s) else None) for m, s in seqs.items()}
            present = [c for c in calls.values() if c is not None]
            if len(present) < len(calls) or len({_signature(c) for c in present}) > 1:
                found.append({"group": group, "seq": k, "calls": calls,
                              "behind": [m for m, c in calls.items() if c is None],
                              "t": min(c["t"] for c in present)})
                break
    # point-to-point: the k-th send from a to b must meet the k-th recv on b from a
    sends, recvs = {}, {}
    for rank, recs in logs.items():
        for r in recs:
            if r["op"] in ("send", "isend") and r.get("dst") is not None:
                sends.setdefault((rank, r["dst"]), []).append((rank, r))
            elif r["op"] in ("recv", "irecv") and r.get("src") is not None:
                recvs.setdefault((r["src"], rank), []).append((rank, r))
    for pair in sorted(set(sends) | set(recvs)):
        s, v = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(s), len(v))):
            a, b = (s[k] if k < len(s) else None), (v[k] if k < len(v) else None)
            if a is None or b is None or (a[1]["shape"], a[1]["dtype"]) != (b[1]["shape"], b[1]["dtype"]):
                calls = {pair[0]: a[1] if a else None, pair[1]: b[1] if b else None}
                found.append({"group": f"send/recv {pair[0]}->{pair[1]}", "seq": k, "calls": calls,
                              "behind": [m for m, c in calls.items() if c is None],
                              "t": min(c["t"] for c in calls.values() if c is not None)})
                break
    if not found:
        return None
    # A rank that never made a call may be stuck in another divergent call (a subgroup's all_reduce with another
    # shape keeps it from the next barrier on WORLD): that divergence is the cause, the other its consequence,
    # whichever began first on the clock.
    def stuck_elsewhere(d):
        if not d["behind"]:
            return False
        others = [o for o in found if o is not d]
        for m in d["behind"]:
            last = logs.get(m, [])[-1:] or [None]
            if not any(last[0] is not None and o["calls"].get(m) is last[0] for o in others):
                return False
        return True
    causes = [d for d in found if not stuck_elsewhere(d)] or found
    return min(causes, key=lambda d: d["t"])


def diagnose(logs: dict[int, list[dict]], world_size: int, status: dict[int, str] | None = None,
             resolve=None) -> str:
    """A few lines: the first collective where the ranks' sequences differ, who is behind, where each rank is.

    ``status`` says what became of each rank ("returned", "failed: ...", "still running"); ``resolve(filename,
    line, function)`` turns a worker's file name (``<dynamic-code>`` for a function sent from a notebook) into
    the learner's (``Cell In[3]``).
    """
    status = status or {}
    lines = []
    d = first_divergence(logs, world_size)
    if d is not None:
        present = {m: c for m, c in d["calls"].items() if c is not None}
        sigs = {}
        for m, c in present.items():
            sigs.setdefault(_signature(c), []).append(m)
        head = f"hang finder: the ranks' collectives part at call #{d['seq']} on group {d['group']}: "
        if d["behind"]:
            # the ranks that made the call wait in it; the others never got there
            waiting = "; ".join(f"rank {m} called {describe_call(c, resolve)}" for m, c in sorted(present.items()))
            behind = []
            for m in d["behind"]:
                last = [r for r in logs.get(m, []) if r["group"] == d["group"]] if not d["group"].startswith("send")\
                    else logs.get(m, [])
                was = f"its last there was {describe_call(last[-1], resolve)}" if last else "it made none there"
                state = status.get(m)
                behind.append(f"rank {m} never called it ({was}" + (f"; then it {state}" if state else "") + ")")
            lines.append(head + waiting + "; " + "; ".join(behind) + ".")
            lines.append(f"Rank(s) {d['behind']} died before it: the others' errors follow from that." if all(
                status.get(m, "").startswith("died") for m in d["behind"]) else f"Rank(s) {d['behind']} behind: look "
                "at what they did instead of that call (a condition on the rank, an early return, a different "
                "number of steps or buckets).")
        else:
            parts = [f"rank{'s' if len(ms) > 1 else ''} {','.join(map(str, ms))} "
                     f"{'are' if len(ms) > 1 else 'is'} in {describe_call(present[ms[0]], resolve)}"
                     for ms in sigs.values()]
            lines.append(head + "; ".join(parts) + ".")
            lines.append("Every rank must call the same collectives, in the same order, with the same shapes and "
                         "dtypes (and the same root).")
    else:
        counts = {r: len(recs) for r, recs in logs.items()}
        lines.append(f"hang finder: the ranks' collectives agree as far as each got ({counts} calls by rank).")
    for rank in range(world_size):
        recs = logs.get(rank, [])
        where = f"last collective #{len(recs) - 1}: {describe_call(recs[-1], resolve)}" if recs else "no collective"
        state = status.get(rank, "")
        lines.append(f"  rank {rank}: {where}" + (f"; {state}" if state else ""))
    return "\n".join(lines)


def report(directory: str, world_size: int, status=None, resolve=None, only_if_divergent: bool = False):
    """:func:`diagnose` on the logs in ``directory``; None when there are none (or, with ``only_if_divergent``,
    when the sequences agree)."""
    logs = read(directory, world_size)
    if not any(logs.values()) or (only_if_divergent and first_divergence(logs, world_size) is None):
        return None
    return diagnose(logs, world_size, status, resolve)


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


def resolver(fn):
    """``resolve(filename, line, function)`` for :func:`diagnose`: code that cloudpickle sent by value runs as
    ``<dynamic-code>`` in the workers; find its real file (a notebook cell, a script) among ``fn``'s code."""
    from ..errors import _cell_name, _code_objects
    codes = {}
    for code in _code_objects(fn) if fn is not None else ():
        codes.setdefault(code.co_name, []).append(code)

    def resolve(filename, line, func):
        if filename == "<dynamic-code>":
            for code in codes.get(func, []):
                lines = [ln for _, _, ln in code.co_lines() if ln is not None]
                if lines and min(lines) <= line <= max(lines):
                    filename = code.co_filename
                    break
        return _cell_name(filename) or filename

    return resolve


def failure_report(directory, world_size, results, failures, pending, timed_out, fn=None):
    """What :class:`simlib.Cluster` adds to a failed call's error: the report after a timeout; after another
    failure only when the ranks' collectives differ (a mismatch that Gloo reported as an error, not a hang)."""
    if not directory:
        return None
    status = {r: "returned from the function" for r in results}
    for r, f in failures.items():
        if f.type_name == "Timeout":
            status[r] = "was still running at the call's time limit"
        elif f.type_name == "WorkerDied":
            status[r] = f"died ({f.message})"
        else:
            why = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", f.summary().split(": ", 1)[1])  # Gloo's file:line
            status[r] = "failed: " + (why.split(". ")[0] if len(why) > 100 else why)
    for r in pending:
        status[r] = "was still running (stopped)"
    try:
        return report(directory, world_size, status, resolver(fn), only_if_divergent=not timed_out)
    except Exception as exc:  # noqa: BLE001 - the report must never hide the error it explains
        return f"hang finder: could not read the collective logs ({type(exc).__name__}: {exc})"


def main(argv=None) -> int:
    """``python -m simlib.debug.hangs DIRECTORY [WORLD_SIZE]``: the report from the logs of a hung run."""
    import glob
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(main.__doc__)
        return 2
    directory = argv[0]
    world = int(argv[1]) if len(argv) > 1 else len(glob.glob(os.path.join(directory, "collectives-rank*.tsv")))
    text = report(directory, world)
    print(text or f"no collective logs in {directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
