"""Checkpoints of the whole training state with ``torch.distributed.checkpoint`` (DCP), saved atomically.

``save(directory, state)`` writes ``directory/step_00000040/`` (DCP: one ``.distcp`` file per rank that holds
data, plus ``.metadata``); ``load_latest(directory, state)`` restores the newest whole one, if any. ``state`` is
what the trainer checkpoints (``simlib.train.TrainState``, or any object with ``state_dict()`` /
``load_state_dict()``, or a plain dict): model, optimizer, learning-rate schedule, step, RNG states, data position.

Atomic: every rank writes into ``step_00000040.partial/``; only when DCP has finished on every rank (its
``.metadata`` is written last, by rank 0, after a collective) does rank 0 rename the folder to its final name.
A crash while saving leaves a ``.partial`` folder that is never loaded, and the previous checkpoint is untouched.
The rename is atomic on one POSIX file system (a local disk, or NFS/Lustre seen from one client).

Resharding: the data-parallel state (model, optimizer) is the same on every rank, so DCP stores it once and any
world size can load it. What differs by rank is the RNG state: it is gathered and stored for every rank, and a
rank loads its own (at a new world size, rank r takes saved rank r mod the old world size, and a warning says so).
Sharded states (FSDP2's DTensors) reshard through DCP itself.

Saving at world size 2 and loading at 1 or 4 therefore continues with the same global batches: the trainer draws
batch ``step`` of the Task, whatever the world size. Sharded plans (TP, PP, ZeRO) keep each rank's part under its
own name (``model.tp1...``); every rank loads its own part, so they resume under the same plan only.

Nothing lost on a fault:
- **Verified before it counts.** A state with a non-finite tensor is not saved. After DCP has written, rank 0
  checks that every entry of ``.metadata`` lies inside its file and writes ``manifest.json`` (size and SHA-256 of
  every file) before the commit. Loading checks the manifest first; a checkpoint that fails (corrupted, truncated,
  deleted files) is skipped with a warning (:class:`CheckpointFallbackWarning`) and the previous one is loaded.
  Rotation never deletes one of the ``keep`` newest checkpoints that still verify.
- **Disk trouble in one line.** :func:`preflight` (the trainer calls it at start) checks that the folder can be
  written and has room for a checkpoint; a full or read-only disk during a save raises :class:`CheckpointError`
  naming the folder, what is free and what to do, and the partial folder is removed.
- **What was trained is recorded.** ``meta.json`` holds what the caller passes as ``meta`` (the trainer: the
  task, the plan and the optimizer); loading with a different one raises :class:`CheckpointMismatch` naming each
  field, unless the field is in ``allow_changes``.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import pickle
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

__all__ = ["save", "load_latest", "load", "latest", "leaving_out", "list_checkpoints", "rng_state", "set_rng_state",
           "Saved", "PER_RANK_KEY", "checkpoint_interval", "wasted_fraction", "verify", "preflight", "CheckpointError",
           "CheckpointMismatch", "CheckpointFallbackWarning", "compare_meta"]

MANIFEST, META = "manifest.json", "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read (disk full, read-only, corrupted); the message says what to do."""


class CheckpointMismatch(ValueError):
    """The checkpoint was saved by another task, plan or optimizer than the one resuming from it."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint could not be read: an older one was loaded instead."""

PER_RANK_KEY = "rng"  # a top-level key of the state dict whose value differs by rank
_NAME = re.compile(r"^step_(\d{8})$")


@dataclass
class Saved:
    """What :func:`save` wrote or :func:`load_latest` read."""

    path: Path
    step: int
    seconds: float  # wall time of the save or load, on this rank (includes the collectives)
    nbytes: int     # size of the checkpoint folder on disk


# ── RNG states (one per rank) ──
def rng_state() -> dict:
    """Every random generator a training step may use: torch CPU (and CUDA), Python's ``random``, NumPy."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


# ── helpers ──
def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist() else 0


def _world() -> int:
    return dist.get_world_size() if _dist() else 1


def _barrier() -> None:
    if _dist():
        dist.barrier()


def _state_dict(state) -> dict:
    if hasattr(state, "state_dict"):
        return dict(state.state_dict())
    if isinstance(state, dict):
        return dict(state)
    raise TypeError(f"state must have state_dict()/load_state_dict() or be a dict, got {type(state).__name__}")


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _structure_problem(path: Path) -> str | None:
    """Does every entry DCP's ``.metadata`` lists lie inside its file? (None: yes; else what is wrong)."""
    try:
        md = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to parse is the answer
        return f"its .metadata cannot be read ({type(exc).__name__}: {str(exc)[:120]})"
    sizes: dict[str, int] = {}
    for index, info in (md.storage_data or {}).items():
        name = info.relative_path
        if name not in sizes:
            f = path / name
            sizes[name] = f.stat().st_size if f.is_file() else -1
        if sizes[name] < 0:
            return f"its file {name} is missing"
        if info.offset + info.length > sizes[name]:
            return (f"its file {name} is truncated ({sizes[name]:,} bytes, entry {index.fqn!r} ends at "
                    f"{info.offset + info.length:,})")
    return None


def _write_manifest(path: Path) -> None:
    files = {f.name: [f.stat().st_size, _sha256(f)] for f in sorted(path.iterdir())
             if f.is_file() and f.name != MANIFEST}
    tmp = path / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST)


_verified: dict = {}  # folder -> the (name, size, mtime) of its files when it last verified: not hashed again


def _stamp(path: Path) -> tuple:
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir()))
    except OSError:
        return ()


def verify(path) -> str | None:
    """Check a committed checkpoint: None when it is whole, else one line saying what is wrong.

    The manifest (sizes and SHA-256 of every file, written before the commit) catches changed, truncated and
    missing files; the structure check catches a ``.metadata`` that points outside its files. A folder whose files
    have not changed (names, sizes, modification times) since it last verified in this process is not re-read."""
    path = Path(path)
    stamp = _stamp(path)
    if stamp and _verified.get(str(path)) == stamp:
        return None
    problem = _verify(path)
    if problem is None and stamp:
        _verified[str(path)] = stamp
    return problem


def _verify(path: Path) -> str | None:
    if not (path / ".metadata").is_file():
        return "it has no .metadata (it was never committed)"
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError, OSError) as exc:
            return f"its {MANIFEST} cannot be read ({exc})"
        for name, (size, digest) in files.items():
            f = path / name
            if not f.is_file():
                return f"its file {name} is missing"
            if f.stat().st_size != size:
                return f"its file {name} has {f.stat().st_size:,} bytes, {size:,} were written"
            if _sha256(f) != digest:
                return f"its file {name} does not match the checksum written with it (corrupted)"
    return _structure_problem(path)


def _errno_of(exc) -> int | None:
    """The OS error number somewhere in ``exc`` (its causes, DCP's per-rank failures), or one read from a message."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if isinstance(e, tuple):  # DCP's failures: (exception, traceback) by rank
            todo += [x for x in e if isinstance(x, BaseException)]
            continue
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e.errno
        text = str(e)
        for code, words in ((errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only file system"),
                            (errno.EACCES, "Permission denied"), (errno.EDQUOT, "Disk quota exceeded"),
                            (errno.EFBIG, "File too large")):
            if words in text:
                return code
        todo += [e.__cause__, e.__context__]
        todo += list((getattr(e, "failures", None) or {}).values())
    return None


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _disk_error(exc, root: Path, step: int, expected: int | None = None) -> CheckpointError:
    """One line for a save that failed on the disk: which folder, why, what is free, what to do."""
    code = _errno_of(exc)
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        free = None
    prev = latest(root)
    kept = f"the previous checkpoint {prev.name} is intact" if prev else "no earlier checkpoint exists"
    need = f"; a checkpoint needs about {_mb(expected)}" if expected else ""
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or (free is not None and expected and free < expected) \
            or "unexpected pos" in str(exc):
        why = (f"the disk holding {root} is full ({_mb(free)} free{need})" if free is not None else
               f"the disk holding {root} is full")
        todo = "free space there, or give a checkpoint_dir on a larger disk"
    elif code == errno.EROFS:
        why, todo = f"{root} is on a read-only file system", "give a checkpoint_dir on a writable disk"
    elif code in (errno.EACCES, errno.EPERM):
        why, todo = f"{root} is not writable by this user", "fix its permissions or give another checkpoint_dir"
    else:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        todo = "see the cause above"
    return CheckpointError(f"checkpoint of step {step} not saved: {why}; {kept}, and the partial folder was "
                           f"removed: {todo}")


def _state_bytes(sd) -> int:
    if isinstance(sd, torch.Tensor):
        return sd.numel() * sd.element_size()
    if isinstance(sd, dict):
        return sum(_state_bytes(v) for v in sd.values())
    if isinstance(sd, (list, tuple)):
        return sum(_state_bytes(v) for v in sd)
    return 0


def _nonfinite(sd, prefix="") -> str | None:
    """The name of the first floating-point tensor in ``sd`` holding NaN or inf, or None."""
    if isinstance(sd, torch.Tensor):
        return prefix.rstrip(".") if sd.is_floating_point() and not bool(torch.isfinite(sd).all()) else None
    items = sd.items() if isinstance(sd, dict) else enumerate(sd) if isinstance(sd, (list, tuple)) else ()
    for k, v in items:
        bad = _nonfinite(v, f"{prefix}{k}.")
        if bad:
            return bad
    return None


def _gather(obj) -> list:
    if not _dist():
        return [obj]
    out = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def preflight(directory, state=None, keep: int = 2) -> int:
    """Before training: can ``directory`` be created and written, and does it have room? Every rank calls it.

    Returns the expected size of one checkpoint in bytes (0 without ``state``); raises :class:`CheckpointError`
    (the same line on every rank) when the folder is not writable or a checkpoint does not fit; warns when fewer
    than ``keep + 1`` fit (``keep`` kept plus the one being written)."""
    root = Path(directory)
    mine = _state_bytes(_state_dict(state)) if state is not None else 0
    sizes = _gather(mine)
    sharded = bool(getattr(state, "shard", ""))
    expected = sum(sizes) if sharded else sizes[0]
    problem, warn = None, None
    if _rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".simlib-write-test-{os.getpid()}"
            with open(probe, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
            free = shutil.disk_usage(root).free
            if expected and free < expected:
                problem = (f"checkpoint_dir {root} has {_mb(free)} free, one checkpoint needs about {_mb(expected)}: "
                           "free space there, or give a checkpoint_dir on a larger disk")
            elif expected and free < (keep + 1) * expected:
                warn = (f"checkpoint_dir {root} has {_mb(free)} free: room for {free // expected} checkpoint(s) of "
                        f"about {_mb(expected)}, while {keep + 1} are on disk during a save (keep={keep})")
        except OSError as exc:
            code = exc.errno
            what = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable by this user",
                    errno.EPERM: "is not writable by this user", errno.ENOSPC: "is on a full disk",
                    errno.EDQUOT: "is over its disk quota"}.get(code, f"cannot be written ({exc.strerror or exc})")
            problem = (f"checkpoint_dir {root} {what}: nothing would be saved; give a checkpoint_dir on a writable "
                       "disk with room")
    if _dist():
        box = [problem, warn]
        dist.broadcast_object_list(box, src=0)
        problem, warn = box
    if problem:
        raise CheckpointError(problem)
    if warn and _rank() == 0:
        warnings.warn(warn, stacklevel=2)
    return expected


def compare_meta(saved: dict, current: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """Fields that differ between two ``meta`` dicts, flattened (``("plan.tp", 2, 1)``)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += compare_meta(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


def _check_meta(path: Path, state, allow_changes) -> list:
    """Raise :class:`CheckpointMismatch` naming every field of the saved ``meta`` that differs from ``state.meta``
    and is not allowed; return the allowed changes."""
    current = getattr(state, "meta", None)
    if not current or not (path / META).is_file():
        return []
    saved = json.loads((path / META).read_text())
    current = json.loads(json.dumps(current, default=str))  # as it would be saved (tuples become lists)
    diffs = compare_meta(saved, current)
    free = set(getattr(state, "free_changes", ()))  # what the caller can resume across (e.g. the DP degree)
    allow = set(allow_changes or ())
    wrong = [d for d in diffs if d[0] not in free and d[0] not in allow and "*" not in allow
             and d[0].split(".")[0] not in allow]
    if wrong:
        listed = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in wrong)
        raise CheckpointMismatch(
            f"{path} was saved by another run than this one ({listed}). Resume with the same settings, use another "
            f"checkpoint_dir, or accept the change explicitly: allow_changes={tuple(k for k, _, _ in wrong)!r}")
    return [d for d in diffs if d[0] not in free]


def list_checkpoints(directory) -> list[tuple[int, Path]]:
    """Whole checkpoints in ``directory`` as ``(step, path)``, oldest first (``.partial`` folders excluded)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / ".metadata").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(directory) -> Path | None:
    """The newest whole checkpoint in ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def _rotate(root: Path, keep: int) -> None:
    """Remove checkpoints older than the ``keep`` newest that verify: a corrupted one never pushes out a good one."""
    good = 0
    for _, p in reversed(list_checkpoints(root)):
        if good >= keep:
            shutil.rmtree(p, ignore_errors=True)
        elif verify(p) is None:
            good += 1


# ── save ──
def save(directory, state, step: int | None = None, keep: int = 2, _before_commit=None, meta: dict | None = None
         ) -> Saved:
    """Save ``state`` to ``directory/step_<step>/`` atomically; call it on every rank at the same step.

    ``step`` defaults to ``state.step`` (or ``state_dict()["step"]``). ``keep`` whole checkpoints are kept (the
    newest ones that verify); older ones and left-over ``.partial`` folders are removed after the new one is
    committed. ``meta`` (default ``state.meta``): a JSON-able dict saved as ``meta.json`` and compared at load.
    A state holding NaN or inf is refused (:class:`CheckpointError`): it would push out a good checkpoint.
    """
    t0 = time.perf_counter()
    root = Path(directory)
    sd = _state_dict(state)
    if step is None:
        step = getattr(state, "step", sd.get("step"))
    if isinstance(step, torch.Tensor):
        step = int(step.item())
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"save needs the step (an int >= 0): pass step= or give state a .step, got {step!r}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (whole checkpoints kept), got {keep}")
    final = root / f"step_{step:08d}"
    partial = root / f"step_{step:08d}.partial"
    bad = [(r, name) for r, name in enumerate(_gather(_nonfinite(sd))) if name]
    if bad:
        prev = latest(root)
        raise CheckpointError(f"checkpoint of step {step} not saved: {bad[0][1]!r} on rank {bad[0][0]} holds NaN or "
                              f"inf (training diverged); {prev.name if prev else 'no checkpoint'} stays the newest "
                              "- resume from it with a lower lr or a grad_clip")
    meta = getattr(state, "meta", None) if meta is None else meta
    if PER_RANK_KEY in sd:  # every rank's RNG state, gathered: DCP keeps one copy of a key, from one rank
        mine = sd[PER_RANK_KEY]
        gathered = [None] * _world()
        if _dist():
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        sd[PER_RANK_KEY] = {"by_rank": pickle.dumps(gathered), "world_size": _world()}
    expected = _state_bytes(sd)
    problem = None
    if _rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save of this step
        except OSError as exc:
            problem = str(_disk_error(exc, root, step, expected))
    if _dist():
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise CheckpointError(problem)
    try:
        dcp.save(sd, checkpoint_id=str(partial), no_dist=not _dist())  # returns after rank 0 wrote .metadata
        if _rank() == 0:
            _fsync_dir(partial)
            if meta:
                (partial / META).write_text(json.dumps(meta, indent=1, default=str))
            problem = _structure_problem(partial)  # a load test of the layout before it counts
            if problem is None:
                _write_manifest(partial)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - disk full, read-only...: DCP raises on every rank
        if _rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise _disk_error(exc, root, step, expected) from exc
    if _dist():
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        if _rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        prev = latest(root)
        raise CheckpointError(f"checkpoint of step {step} not saved: what was written fails its check ({problem}); "
                              f"{prev.name if prev else 'no checkpoint'} stays the newest")
    if _before_commit is not None:  # tests: a crash between the writes and the commit
        _before_commit()
    if _rank() == 0:
        old = None
        if final.exists():  # the same step saved again (after a restart): swap, then remove the old one
            old = root / f"step_{step:08d}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(partial, final)  # the commit: atomic rename
        _verified[str(final)] = _stamp(final)  # its manifest was just written from these very files
        _fsync_dir(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _rotate(root, keep)
        for p in root.glob("step_*.partial"):
            shutil.rmtree(p, ignore_errors=True)
    _barrier()
    return Saved(final, step, time.perf_counter() - t0, _folder_bytes(final) if _rank() == 0 else 0)


# ── load ──
def _flat_keys(sd: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in sd.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            keys |= _flat_keys(v, name + ".")
        elif isinstance(v, (list, tuple)) and v and any(isinstance(x, (dict, torch.Tensor)) for x in v):
            for i, x in enumerate(v):
                keys |= _flat_keys({str(i): x}, name + ".")
        else:
            keys.add(name)
    return keys


def load(path, state, skip=(), allow_changes=()) -> Saved:
    """Load the checkpoint folder ``path`` into ``state`` (every rank calls it).

    ``skip``: top-level parts (e.g. ``"optimizer"``, ``"rng"``, ``"data"``) left out of the load, as if they had
    not been saved: lesson 08 shows what each omission does to the loss curve. ``allow_changes``: fields of the
    saved ``meta`` (``"optim.lr"``, ``"task.seed"``, a whole part ``"optim"``, or ``"*"``) that may differ from
    ``state.meta``; any other difference raises :class:`CheckpointMismatch` naming the field."""
    t0 = time.perf_counter()
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a whole checkpoint (no .metadata): it was not committed")
    changes = _check_meta(path, state, allow_changes)
    saved_keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    optimizer = getattr(state, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "local"):
        optimizer = optimizer.local  # ZeRO-1/2: the rank's inner optimizer holds the state (None: owns nothing)
    if (isinstance(optimizer, torch.optim.Optimizer) and not optimizer.state and "optimizer" not in skip
            and any(k.startswith("optimizer.") and ".state." in k for k in saved_keys)):
        # a fresh optimizer has no state (Adam's moments) until its first step, and DCP loads only what the target
        # holds: create it first, as torch.distributed.checkpoint.state_dict does (a step with zero lr and grads)
        from torch.distributed.checkpoint.state_dict import _init_optim_state
        _init_optim_state(optimizer)
    sd = _state_dict(state)
    unknown = [k for k in skip if k not in sd]
    if unknown:
        raise ValueError(f"skip={list(skip)}: {unknown} not in the state (its parts: {sorted(sd)})")
    for k in skip:
        del sd[k]
    per_rank = PER_RANK_KEY in sd
    if per_rank:
        sd[PER_RANK_KEY] = {"by_rank": b"", "world_size": 0}
    wanted = set().union(*_gather(sorted(_flat_keys(sd))))  # every rank's keys: a sharded plan's ranks differ
    extra = sorted(k for k in saved_keys - wanted if not k.startswith(PER_RANK_KEY + ".")
                   and k.split(".")[0] not in skip)
    if extra:  # DCP loads only what the target asks for: the rest would be silently dropped
        shown = ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else "")
        shards = sorted({k.split(".")[1] for k in extra if k.split(".")[0] in ("model", "optimizer")
                         and re.match(r"^(pp|tp|dp)\d", k.split(".")[1] if "." in k else "")})
        if shards:
            hint = (f"The checkpoint holds the parts of a sharded plan ({', '.join(shards)}) that no rank of this "
                    "run asks for: it was saved under another plan (tp, pp, zero_stage or the dp degree of ZeRO). "
                    "Resume under the plan that saved it.")
        else:
            hint = ("Usually a fresh optimizer: its state (Adam's moments) is empty until its first step, so DCP "
                    "would skip it. Build the optimizer part with torch.distributed.checkpoint.state_dict."
                    "get_state_dict(model, optimizer), which creates it, and load with set_state_dict.")
        raise ValueError(f"{path} holds {len(extra)} entries the state to load into does not ask for ({shown}). "
                         + hint)
    dcp.load(sd, checkpoint_id=str(path), no_dist=not _dist())
    if per_rank:
        by_rank = pickle.loads(sd[PER_RANK_KEY]["by_rank"])
        saved_world, rank, world = len(by_rank), _rank(), _world()
        if saved_world != world and rank == 0:
            warnings.warn(f"checkpoint {path.name} was saved by {saved_world} rank(s), loaded by {world}: rank r "
                          f"takes the RNG state of saved rank r mod {saved_world}", stacklevel=3)
        sd[PER_RANK_KEY] = by_rank[rank % saved_world]
    if hasattr(state, "load_state_dict"):
        state.load_state_dict(sd)
    else:
        state.update(sd)
    if changes and _rank() == 0:
        warnings.warn(f"resumed from {path.name} with changes allowed by allow_changes: "
                      + "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changes), stacklevel=3)
    m = _NAME.match(path.name)
    return Saved(path, int(m.group(1)) if m else -1, time.perf_counter() - t0,
                 _folder_bytes(path) if _rank() == 0 else 0)


_leave_out: tuple = ()


@contextlib.contextmanager
def leaving_out(*parts: str):
    """Inside the block, :func:`load_latest` restores everything but ``parts`` (e.g. ``"optimizer"``, ``"rng"``,
    ``"data"``), as if they had never been saved: lesson 08's classic bugs, shown through the real trainer."""
    global _leave_out
    before, _leave_out = _leave_out, tuple(parts)
    try:
        yield
    finally:
        _leave_out = before


def load_latest(directory, state, skip=None, allow_changes=()) -> Saved | None:
    """Restore the newest whole checkpoint in ``directory`` into ``state``; None (and ``state`` untouched) when
    there is none. Every rank calls it; rank 0 picks the folder so that all ranks load the same one.
    ``skip``: parts left out (default: none, or those of an enclosing :func:`leaving_out`).

    A checkpoint that fails :func:`verify` (corrupted, truncated) or that DCP cannot read is passed over for the
    previous one, with a :class:`CheckpointFallbackWarning` naming both; when none can be read,
    :class:`CheckpointError` (never a silent fresh start over a folder of broken checkpoints)."""
    skip = _leave_out if skip is None else tuple(skip)
    if directory is None:
        return None
    found = [str(p) for _, p in reversed(list_checkpoints(directory))]
    newest = found[0] if found else ""
    headless = sorted((p.name for p in Path(directory).glob("step_*") if _NAME.match(p.name) and p.is_dir()
                       and not (p / ".metadata").is_file() and str(p) > newest), reverse=True) \
        if Path(directory).is_dir() else []
    if _dist():  # rank 0's view decides, so that every rank tries the same folders
        box = [found, headless]
        dist.broadcast_object_list(box, src=0)
        found, headless = box
    found = [Path(p) for p in found]
    # (name, why) of checkpoints that could not be read; a committed name without .metadata lost it afterwards
    passed = [(name, "its .metadata is missing (deleted after the commit)") for name in headless]
    for i, candidate in enumerate(found):
        problem = verify(candidate) if _rank() == 0 else None
        if _dist():
            box = [problem]
            dist.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem is None:
            try:
                saved = load(candidate, state, skip, allow_changes)
            except (CheckpointMismatch, ValueError, FileNotFoundError):
                raise  # the run's own settings are at fault, not the file: say so, do not fall back
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP could not read it: the previous one
                problem = f"it cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
            problems = [p for p in _gather(problem) if p]  # every rank falls back together, or none does
            problem = problems[0] if problems else None
            if problem is None:
                if passed and _rank() == 0:
                    msg = ("; ".join(f"checkpoint {n} cannot be used: {why}" for n, why in passed)
                           + f". Resumed from the previous one, {candidate.name}")
                    warnings.warn(msg, CheckpointFallbackWarning, stacklevel=2)
                return saved
        passed.append((candidate.name, problem))
    if passed:
        raise CheckpointError(f"no checkpoint in {directory} can be read: "
                              + "; ".join(f"{n}: {why}" for n, why in passed)
                              + ". Move the folder aside to start afresh, or restore a copy")
    return None


# ── how often to checkpoint ──
def checkpoint_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Compute time between checkpoints that wastes the least, by Daly's formula (Daly 2006, "A higher order
    estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3)); its first term is Young's
    ``sqrt(2 * save * MTBF)`` (Young 1974, CACM 17(9)). ``mtbf_seconds``: mean time between failures of the whole
    job (one node's MTBF / number of nodes)."""
    d, m = float(save_seconds), float(mtbf_seconds)
    if d <= 0 or m <= 0:
        raise ValueError(f"save_seconds and mtbf_seconds must be > 0, got {save_seconds!r}, {mtbf_seconds!r}")
    if d >= 2 * m:
        return m
    r = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(r) / 3 + r / 9) - d


def wasted_fraction(interval: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """First-order share of the time lost to failures (Young 1974): saving (``save / interval``), the work
    redone after a failure (half an interval plus a save, on average) and the restart, each per MTBF."""
    return save_seconds / interval + ((interval + save_seconds) / 2 + restart_seconds) / mtbf_seconds
