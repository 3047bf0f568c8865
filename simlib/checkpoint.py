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
  written and has room for the run's saves (``keep`` kept plus the one being written); a full or read-only disk
  during a save raises :class:`CheckpointError` naming the folder, what is free and what to do; no partial is left.
- **What was trained is recorded.** ``meta.json`` holds what the caller passes as ``meta`` (the trainer: the
  task, the plan and the optimizer); loading with a different one raises :class:`CheckpointMismatch` naming each
  field, unless the field is in ``allow_changes``.
"""

from __future__ import annotations

import contextlib
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
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

__all__ = [
    "save",
    "load_latest",
    "load",
    "latest",
    "leaving_out",
    "list_checkpoints",
    "rng_state",
    "set_rng_state",
    "Saved",
    "PER_RANK_KEY",
    "checkpoint_interval",
    "wasted_fraction",
    "verify",
    "preflight",
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointFallbackWarning",
    "compare_meta",
    "hold",
    "claim",
]

from .checkpoint_files import (  # noqa: F401 - the folder on disk; re-exported here, where callers import it
    _NAME,
    META,
    PER_RANK_KEY,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointMismatch,
    _barrier,
    _disk_error,
    _dist,
    _folder_bytes,
    _fsync_dir,
    _gather,
    _nonfinite,
    _rank,
    _rotate,
    _save_bytes,
    _stamp,
    _state_dict,
    _structure_problem,
    _verified,
    _with_rng,
    _world,
    _write_manifest,
    from_rank0,
    latest,
    list_checkpoints,
    preflight,
    verify,
)
from .checkpoint_lock import claim, hold  # noqa: F401 - one run per folder


@dataclass
class Saved:
    """What :func:`save` wrote or :func:`load_latest` read."""

    path: Path
    step: int
    seconds: float  # wall time of the save or load, on this rank (includes the collectives)
    nbytes: int  # size of the checkpoint folder on disk


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
    layout = _layout_changes(diffs, saved)
    if layout:  # each rank's part is stored under the saved layout: no allow_changes can load it into another
        saved_plan = ", ".join(f"{k.split('.', 1)[1]}={a!r}" for k, a, _ in layout)
        listed = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in layout)
        raise CheckpointMismatch(
            f"{path} was saved under another parallel layout ({listed}): each rank's part of the model and "
            f"optimizer is stored for that layout, and this checkpoint cannot be resharded into another. Resume "
            f"with the saved layout (Plan({saved_plan}, ...)), or give another checkpoint_dir to start afresh"
        )
    allow = set(allow_changes or ())
    wrong = [
        d
        for d in diffs
        if d[0] not in free and d[0] not in allow and "*" not in allow and d[0].split(".")[0] not in allow
    ]
    if wrong:
        listed = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in wrong)
        raise CheckpointMismatch(
            f"{path} was saved by another run than this one ({listed}). Resume with the same settings, use another "
            f"checkpoint_dir, or accept the change explicitly: allow_changes={tuple(k for k, _, _ in wrong)!r}"
        )
    return [d for d in diffs if d[0] not in free]


LAYOUT = ("plan.tp", "plan.pp", "plan.ep", "plan.zero_stage")  # they decide which part each rank holds


def _layout_changes(diffs, saved: dict) -> list:
    """The differences that change what each rank holds (the shards of TP, PP, EP; ZeRO's optimizer shards over
    dp, so there the DP degree too)."""
    zero = bool((saved.get("plan") or {}).get("zero_stage")) or any(k == "plan.zero_stage" and b for k, _, b in diffs)
    return [d for d in diffs if d[0] in LAYOUT or (d[0] == "plan.dp" and zero)]


# ── save ──
def save(
    directory, state, step: int | None = None, keep: int = 2, _before_commit=None, meta: dict | None = None
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
        raise CheckpointError(
            f"checkpoint of step {step} not saved: {bad[0][1]!r} on rank {bad[0][0]} holds NaN or "
            f"inf (training diverged); {prev.name if prev else 'no checkpoint'} stays the newest "
            "- resume from it with a lower lr or a grad_clip"
        )
    meta = getattr(state, "meta", None) if meta is None else meta
    if PER_RANK_KEY in sd:  # every rank's RNG state, gathered: DCP keeps one copy of a key, from one rank
        sd = _with_rng(sd, _gather(sd[PER_RANK_KEY]))
    expected = _save_bytes(sd, meta, _world(), root)
    problem = None
    if _rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save of this step
        except OSError as exc:
            problem = str(_disk_error(exc, root, step, expected))
    problem = from_rank0(problem)
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
    problem = from_rank0(problem)
    if problem:
        if _rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        prev = latest(root)
        raise CheckpointError(
            f"checkpoint of step {step} not saved: what was written fails its check ({problem}); "
            f"{prev.name if prev else 'no checkpoint'} stays the newest"
        )
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
    if (
        isinstance(optimizer, torch.optim.Optimizer)
        and not optimizer.state
        and "optimizer" not in skip
        and any(k.startswith("optimizer.") and ".state." in k for k in saved_keys)
    ):
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
    extra = sorted(
        k for k in saved_keys - wanted if not k.startswith(PER_RANK_KEY + ".") and k.split(".")[0] not in skip
    )
    if extra:  # DCP loads only what the target asks for: the rest would be silently dropped
        shown = ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else "")
        shards = sorted(
            {
                k.split(".")[1]
                for k in extra
                if k.split(".")[0] in ("model", "optimizer")
                and re.match(r"^(pp|tp|dp)\d", k.split(".")[1] if "." in k else "")
            }
        )
        mine = getattr(state, "shard", "")
        if shards:
            hint = (
                f"The checkpoint holds the parts of a sharded plan ({', '.join(shards)}) that no rank of this "
                "run asks for: it was saved under another plan (tp, pp, zero_stage or the dp degree of ZeRO). "
                "Resume under the plan that saved it."
            )
        elif mine and any(k.split(".")[0] in ("model", "optimizer") for k in extra):
            hint = (
                f"The checkpoint holds a whole (unsharded) model and optimizer, saved by a plan without tp, pp, "
                f"ep or ZeRO, while this run's ranks hold parts ({mine} here): the plan changed. Resume under the "
                "plan that saved it (e.g. zero_stage=0), or give another checkpoint_dir."
            )
        else:
            hint = (
                "Usually a fresh optimizer: its state (Adam's moments) is empty until its first step, so DCP "
                "would skip it. Build the optimizer part with torch.distributed.checkpoint.state_dict."
                "get_state_dict(model, optimizer), which creates it, and load with set_state_dict."
            )
        raise ValueError(
            f"{path} holds {len(extra)} entries the state to load into does not ask for ({shown}). " + hint
        )
    dcp.load(sd, checkpoint_id=str(path), no_dist=not _dist())
    if per_rank:
        by_rank = pickle.loads(sd[PER_RANK_KEY]["by_rank"])
        saved_world, rank, world = len(by_rank), _rank(), _world()
        if saved_world != world and rank == 0:
            warnings.warn(
                f"checkpoint {path.name} was saved by {saved_world} rank(s), loaded by {world}: rank r "
                f"takes the RNG state of saved rank r mod {saved_world}",
                stacklevel=3,
            )
        sd[PER_RANK_KEY] = by_rank[rank % saved_world]
    if hasattr(state, "load_state_dict"):
        state.load_state_dict(sd)
    else:
        state.update(sd)
    if changes and _rank() == 0:
        warnings.warn(
            f"resumed from {path.name} with changes allowed by allow_changes: "
            + "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changes),
            stacklevel=3,
        )
    m = _NAME.match(path.name)
    return Saved(
        path, int(m.group(1)) if m else -1, time.perf_counter() - t0, _folder_bytes(path) if _rank() == 0 else 0
    )


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
    headless = (
        sorted(
            (
                p.name
                for p in Path(directory).glob("step_*")
                if _NAME.match(p.name) and p.is_dir() and not (p / ".metadata").is_file() and str(p) > newest
            ),
            reverse=True,
        )
        if Path(directory).is_dir()
        else []
    )
    # rank 0's view decides, so that every rank tries the same folders
    found, headless = from_rank0(found, headless)
    found = [Path(p) for p in found]
    # (name, why) of checkpoints that could not be read; a committed name without .metadata lost it afterwards
    passed = [(name, "its .metadata is missing (deleted after the commit)") for name in headless]
    for candidate in found:
        problem = verify(candidate) if _rank() == 0 else None
        problem = from_rank0(problem)
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
                    msg = (
                        "; ".join(f"checkpoint {n} cannot be used: {why}" for n, why in passed)
                        + f". Resumed from the previous one, {candidate.name}"
                    )
                    warnings.warn(msg, CheckpointFallbackWarning, stacklevel=2)
                return saved
        passed.append((candidate.name, problem))
    if passed:
        raise CheckpointError(
            f"no checkpoint in {directory} can be read: "
            + "; ".join(f"{n}: {why}" for n, why in passed)
            + ". Move the folder aside to start afresh, or restore a copy"
        )
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
