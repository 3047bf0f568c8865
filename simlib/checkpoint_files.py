"""The checkpoint folder on disk: naming, listing, verification (manifest and structure), rotation, disk errors.

:mod:`simlib.checkpoint` saves and loads through DCP; this module is what it checks on disk before and after: a
folder ``step_00000040/`` counts only when its ``.metadata`` is there, its ``manifest.json`` (size and SHA-256 of
every file) matches and every entry of the ``.metadata`` lies inside its file. :func:`preflight` checks, before
training, that the folder can be written and has room. Everything here is re-exported by :mod:`simlib.checkpoint`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MANIFEST, META = "manifest.json", "meta.json"
PER_RANK_KEY = "rng"  # a top-level key of the state dict whose value differs by rank


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read (disk full, read-only, corrupted); the message says what to do."""


class CheckpointMismatch(ValueError):
    """The checkpoint was saved by another task, plan or optimizer than the one resuming from it."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint could not be read: an older one was loaded instead."""


_NAME = re.compile(r"^step_(\d{8})$")


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
            return (
                f"its file {name} is truncated ({sizes[name]:,} bytes, entry {index.fqn!r} ends at "
                f"{info.offset + info.length:,})"
            )
    return None


def _write_manifest(path: Path) -> None:
    files = {
        f.name: [f.stat().st_size, _sha256(f)] for f in sorted(path.iterdir()) if f.is_file() and f.name != MANIFEST
    }
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
    if not manifest.is_file():  # every commit writes one first: without it nothing can say the files are whole
        return (
            f"it has no {MANIFEST} (deleted, or not written by simlib.checkpoint.save), so its files cannot be verified"
        )
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
        for code, words in (
            (errno.ENOSPC, "No space left"),
            (errno.EROFS, "Read-only file system"),
            (errno.EACCES, "Permission denied"),
            (errno.EDQUOT, "Disk quota exceeded"),
            (errno.EFBIG, "File too large"),
        ):
            if words in text:
                return code
        todo += [e.__cause__, e.__context__]
        todo += list((getattr(e, "failures", None) or {}).values())
    return None


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


_PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Timed out waiting",
    "Socket Timeout",
    "Connection refused",
)


def _disk_error(exc, root: Path, step: int, expected: int | None = None) -> CheckpointError:
    """One line for a save that failed: which folder, why (the disk, or a rank lost during the save's
    collectives), what is free, what is on disk now, what to do."""
    partial = root / f"step_{step:08d}.partial"
    prev = latest(root)
    kept = f"the previous checkpoint {prev.name} is intact" if prev else "no earlier checkpoint exists"
    left = (
        f"{partial.name} is still on disk (never loaded: only committed folders are; the next save removes it)"
        if partial.exists()
        else "the partial folder was removed"
    )
    lost = next((w for w in _PEER_LOST if w in str(exc) or w in str(exc.__cause__ or "")), None)
    if lost and _errno_of(exc) is None:
        return CheckpointError(
            f"checkpoint of step {step} not saved on rank {_rank()}: another rank was lost during "
            f"the save ({lost}; the rank that died is named first); {kept}, and {left}: resume "
            "from the newest checkpoint"
        )
    code = _errno_of(exc)
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        free = None
    need = f"; a checkpoint needs about {_mb(expected)}" if expected else ""
    if (
        code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        or (free is not None and expected and free < expected)
        or "unexpected pos" in str(exc)
    ):
        why = (
            f"the disk holding {root} is full ({_mb(free)} free{need})"
            if free is not None
            else f"the disk holding {root} is full"
        )
        todo = "free space there, or give a checkpoint_dir on a larger disk"
    elif code == errno.EROFS:
        why, todo = f"{root} is on a read-only file system", "give a checkpoint_dir on a writable disk"
    elif code in (errno.EACCES, errno.EPERM):
        why, todo = f"{root} is not writable by this user", "fix its permissions or give another checkpoint_dir"
    else:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        todo = "see the cause above"
    return CheckpointError(f"checkpoint of step {step} not saved: {why}; {kept}, and {left}: {todo}")


_OVERHEAD: dict = {}  # (dtype, ndim) -> bytes torch.save adds around one tensor's data


def _tensor_bytes(t: torch.Tensor) -> int:
    """What DCP writes for one tensor: ``torch.save`` of it (a small zip archive around the data, which it pads
    to 64-byte alignment), measured once per dtype and rank."""
    key = (t.dtype, t.dim())
    if key not in _OVERHEAD:
        probe = torch.zeros((1,) * t.dim(), dtype=t.dtype)
        buf = io.BytesIO()
        torch.save(probe, buf)
        _OVERHEAD[key] = buf.tell() - probe.element_size() + 64
    return _OVERHEAD[key] + t.numel() * t.element_size()


def _with_rng(sd: dict, gathered: list) -> dict:
    """``sd`` as :func:`simlib.checkpoint.save` writes it: every rank's RNG state, gathered and pickled once."""
    if PER_RANK_KEY in sd:
        sd = {**sd, PER_RANK_KEY: {"by_rank": pickle.dumps(gathered), "world_size": len(gathered)}}
    return sd


def _first_step_state(state) -> dict | None:
    """The optimizer state a first step will create (Adam's moments, SGD's momentum), on the meta device (no
    memory): at start-up a fresh optimizer holds none, while every checkpoint will. None when it already has
    some (or cannot be told). A copy of the optimizer over meta tensors steps, not the real one (no hooks run)."""
    optimizer = getattr(state, "optimizer", None)
    inner = getattr(optimizer, "local", optimizer)  # ZeRO-1/2: the rank's inner optimizer
    if not isinstance(inner, torch.optim.Optimizer) or inner.state:
        return None
    groups = []
    for g in inner.param_groups:
        params = []
        for p in g["params"]:
            local = p.to_local() if hasattr(p, "to_local") else p
            m = torch.nn.Parameter(torch.empty_like(local, device="meta"), requires_grad=p.requires_grad)
            m.grad = torch.empty_like(m) if p.requires_grad else None
            params.append(m)
        groups.append({**{k: v for k, v in g.items() if k not in ("params", "foreach", "fused")}, "params": params})
    try:
        probe = type(inner)(groups)  # every hyperparameter comes with its group
        probe.step()
    except Exception:  # noqa: BLE001 - an optimizer that does not run on meta tensors: no estimate of its state
        return None
    return probe.state_dict()["state"]


def _save_bytes(sd: dict, meta=None, ranks: int = 1, root=".") -> int:
    """Bytes one save of ``sd`` (as :func:`_with_rng` gives it) writes, an upper bound: DCP's data file (each
    tensor and each other value through ``torch.save``), its ``.metadata`` (pickled: every entry's shape, dtype
    and place in its file), ``meta.json`` and ``manifest.json`` (``ranks``: the data files listed)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.default_planner import _create_default_local_metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex, StorageMeta, TensorStorageMetadata

    flat, mappings = flatten_state_dict(sd)
    data = 0
    for value in flat.values():
        if isinstance(value, torch.Tensor):
            data += _tensor_bytes(value.to_local() if hasattr(value, "to_local") else value)
        else:
            buf = io.BytesIO()
            torch.save(value, buf)
            data += buf.tell()
    md = _create_default_local_metadata(flat)
    far = 2**62  # offsets and lengths pickle at most this long
    storage = {}
    for fqn, item in md.state_dict_metadata.items():
        chunks = item.chunks if isinstance(item, TensorStorageMetadata) else [None]
        for i, chunk in enumerate(chunks):
            index = MetadataIndex(fqn, chunk.offsets, i) if chunk is not None else MetadataIndex(fqn)
            storage[index] = _StorageInfo(f"__{ranks - 1}_0.distcp", far, far)
    md.storage_data, md.planner_data = storage, mappings
    md.storage_meta = StorageMeta(
        checkpoint_id=Path(root, "step_00000000.partial"), save_id=str(uuid.uuid4()), load_id=str(uuid.uuid4())
    )
    metadata = len(pickle.dumps(md)) + 256  # + what a version of DCP may add (module names, a version string)
    names = [f"__{r}_0.distcp" for r in range(ranks)] + [".metadata"] + ([META] if meta else [])
    manifest = len(json.dumps({"files": {n: [far, "0" * 64] for n in names}}, indent=1))
    return data + metadata + manifest + (len(json.dumps(meta, indent=1, default=str)) if meta else 0)


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


def disk_needed(expected: int, kept: list[int], keep: int = 2, saves: int | None = None) -> int:
    """Free bytes a run's saves need at their peak, beyond what is on disk now: each save writes ``expected`` bytes
    beside what rotation kept (``kept``: the sizes of the checkpoints in the folder, newest first), then rotation
    leaves the ``keep`` newest. ``saves``: how many the run makes (None: as many as it takes to reach the steady
    state of ``keep`` kept plus the one being written)."""
    on_disk, peak = list(kept), 0
    for _ in range(min(keep + 1, saves) if saves is not None else keep + 1):
        peak = max(peak, sum(on_disk) + expected)
        on_disk = ([expected] + on_disk)[:keep]
    return max(0, peak - sum(kept))


def preflight(directory, state=None, keep: int = 2, saves: int | None = None) -> int:
    """Before training: can ``directory`` be created and written, and does it have room? Every rank calls it.

    Returns the expected size of one checkpoint in bytes (0 without ``state``); raises :class:`CheckpointError`
    (the same line on every rank) when the folder is not writable or the run's saves do not fit: ``keep`` kept by
    rotation plus the one being written (fewer when the run makes fewer ``saves``), beside the checkpoints already
    in the folder. A run that would fill the disk at its third save fails now, before any step, not then."""
    root = Path(directory)
    sd = _state_dict(state) if state is not None else {}
    rngs = _gather(sd.get(PER_RANK_KEY))
    meta = getattr(state, "meta", None)
    first = _first_step_state(state) if state is not None else None
    if first:  # what the optimizer will hold from its first step on (saved under its own name: the same bytes)
        sd["optimizer_first_step"] = first
    mine = _save_bytes(_with_rng(sd, rngs), meta, _world(), root) if state is not None else 0
    sizes = _gather(mine)
    sharded = bool(getattr(state, "shard", ""))
    expected = sum(sizes) if sharded else sizes[0]  # DP: every rank holds the same state, DCP writes it once
    problem = None
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
            kept = [_folder_bytes(p) for _, p in reversed(list_checkpoints(root))]
            needed = disk_needed(expected, kept, keep, saves) if expected else 0
            if needed > free:
                n = min(keep + 1, saves) if saves is not None else keep + 1
                why = (
                    f"one checkpoint needs about {_mb(expected)}"
                    if n == 1 or free < expected
                    else f"room for {free // expected} checkpoint(s) of about {_mb(expected)}, while {n} are on "
                    f"disk during a save (keep={keep} kept by rotation plus the one being written), so save "
                    f"{free // expected + 1} would fail mid-run"
                )
                problem = (
                    f"checkpoint_dir {root} has {_mb(free)} free, {why}: the run needs about {_mb(needed)} free. "
                    "Free space there, or give a checkpoint_dir on a larger disk"
                )
        except OSError as exc:
            code = exc.errno
            what = {
                errno.EROFS: "is on a read-only file system",
                errno.EACCES: "is not writable by this user",
                errno.EPERM: "is not writable by this user",
                errno.ENOSPC: "is on a full disk",
                errno.EDQUOT: "is over its disk quota",
            }.get(code, f"cannot be written ({exc.strerror or exc})")
            problem = (
                f"checkpoint_dir {root} {what}: nothing would be saved; give a checkpoint_dir on a writable "
                "disk with room"
            )
    problem = from_rank0(problem)
    if problem:
        raise CheckpointError(problem)
    return expected


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


def from_rank0(*values):
    """Rank 0's ``values`` on every rank (one broadcast; as they are without a process group): what rank 0 alone
    checked on disk decides for all, so every rank raises, or goes on, together."""
    if _dist():
        box = list(values)
        dist.broadcast_object_list(box, src=0)
        values = tuple(box)
    return values if len(values) > 1 else values[0]
