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
batch ``step`` of the Task, whatever the world size.
"""
from __future__ import annotations

import contextlib
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

__all__ = ["save", "load_latest", "load", "latest", "leaving_out", "list_checkpoints", "rng_state", "set_rng_state",
           "Saved", "PER_RANK_KEY", "checkpoint_interval", "wasted_fraction"]

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


# ── save ──
def save(directory, state, step: int | None = None, keep: int = 2, _before_commit=None) -> Saved:
    """Save ``state`` to ``directory/step_<step>/`` atomically; call it on every rank at the same step.

    ``step`` defaults to ``state.step`` (or ``state_dict()["step"]``). ``keep`` whole checkpoints are kept (the
    newest ones); older ones and left-over ``.partial`` folders are removed after the new one is committed.
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
    if PER_RANK_KEY in sd:  # every rank's RNG state, gathered: DCP keeps one copy of a key, from one rank
        mine = sd[PER_RANK_KEY]
        gathered = [None] * _world()
        if _dist():
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        sd[PER_RANK_KEY] = {"by_rank": pickle.dumps(gathered), "world_size": _world()}
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save of this step
    _barrier()
    dcp.save(sd, checkpoint_id=str(partial), no_dist=not _dist())  # returns on every rank after rank 0 wrote .metadata
    if _before_commit is not None:  # tests: a crash between the writes and the commit
        _before_commit()
    if _rank() == 0:
        _fsync_dir(partial)
        old = None
        if final.exists():  # the same step saved again (after a restart): swap, then remove the old one
            old = root / f"step_{step:08d}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(partial, final)  # the commit: atomic rename
        _fsync_dir(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        for _, p in list_checkpoints(root)[:-keep]:
            shutil.rmtree(p, ignore_errors=True)
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


def load(path, state, skip=()) -> Saved:
    """Load the checkpoint folder ``path`` into ``state`` (every rank calls it).

    ``skip``: top-level parts (e.g. ``"optimizer"``, ``"rng"``, ``"data"``) left out of the load, as if they had
    not been saved: lesson 08 shows what each omission does to the loss curve."""
    t0 = time.perf_counter()
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a whole checkpoint (no .metadata): it was not committed")
    saved_keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    optimizer = getattr(state, "optimizer", None)
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
    wanted = _flat_keys(sd)
    shard = getattr(state, "shard", "")  # TP/PP/ZeRO: this rank asks for its own part; the others' are not extra
    others = tuple(f"{part}." for part in ("model", "optimizer")) if shard else ()
    extra = sorted(k for k in saved_keys - wanted if not k.startswith(PER_RANK_KEY + ".")
                   and k.split(".")[0] not in skip
                   and not (k.startswith(others) and not k.split(".", 1)[1].startswith(shard + ".")))
    if extra:  # DCP loads only what the target asks for: the rest would be silently dropped
        shown = ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else "")
        raise ValueError(
            f"{path} holds {len(extra)} entries the state to load into does not ask for ({shown}). Usually a fresh "
            "optimizer: its state (Adam's moments) is empty until its first step, so DCP would skip it. Build the "
            "optimizer part with torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer), which "
            "creates it, and load with set_state_dict.")
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


def load_latest(directory, state, skip=None) -> Saved | None:
    """Restore the newest whole checkpoint in ``directory`` into ``state``; None (and ``state`` untouched) when
    there is none. Every rank calls it; rank 0 picks the folder so that all ranks load the same one.
    ``skip``: parts left out (default: none, or those of an enclosing :func:`leaving_out`)."""
    skip = _leave_out if skip is None else tuple(skip)
    if directory is None:
        return None
    path = latest(directory)
    if _dist():
        box = [str(path) if path is not None else None]
        dist.broadcast_object_list(box, src=0)
        path = Path(box[0]) if box[0] is not None else None
    if path is None:
        return None
    return load(path, state, skip)


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
