"""Faults on purpose (lesson 08 and its tests): a rank killed at a step, or killed while it saves a checkpoint.

``KillAt(task, step=7, rank=1)`` is the task itself, except that rank 1 kills its own process (SIGKILL: no
clean-up, no exception, as when a node dies) when it reaches step 7, on the first attempt only; the restarted
workers (``TORCHELASTIC_RESTART_COUNT`` > 0) run normally. With ``during_save=True`` the rank dies instead in the
middle of the first checkpoint save at or after that step: after writing its own file, before the commit.

``read_run(out_dir)`` reads the run record back as attempts: a resumed run appends to ``run.jsonl``, and each
restart shows as the step going back to the restored one.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
from pathlib import Path

__all__ = ["KillAt", "read_run", "die"]


def die() -> None:
    """End this process at once, as a lost node does: SIGKILL, nothing flushed, nothing reported."""
    os.kill(os.getpid(), signal.SIGKILL)


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _die_in_next_save() -> None:
    """Patch this process's DCP writer: the next save writes this rank's file, then the process dies."""
    from torch.distributed.checkpoint import FileSystemWriter

    write = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        out = write(self, plan, planner)
        out.wait()
        die()
        return out

    FileSystemWriter.write_data = write_then_die


class KillAt:
    """``task``, but rank ``rank`` dies at ``step`` (or during the first save from then on) on attempt ``attempt``."""

    def __init__(self, task, step: int, rank: int = 1, attempt: int = 0, during_save: bool = False):
        self.task, self.step, self.rank, self.attempt, self.during_save = task, step, rank, attempt, during_save
        try:
            takes_part = "part" in inspect.signature(task.batch).parameters
        except (TypeError, ValueError):
            takes_part = False
        self.batch = self._batch_part if takes_part else self._batch  # train() reads the signature

    def __getattr__(self, name):  # everything else is the task's
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def _maybe_die(self, step: int) -> None:
        if step == self.step and _attempt() == self.attempt and _rank() == self.rank:
            if self.during_save:
                _die_in_next_save()
            else:
                print(
                    f"rank {self.rank}: killed on purpose at step {step} (simlib.faults.KillAt: SIGKILL, as a lost "
                    "node)",
                    file=sys.stderr,
                    flush=True,
                )
                die()

    def _batch(self, step: int):
        self._maybe_die(step)
        return self.task.batch(step)

    def _batch_part(self, step: int, part: int = 0, parts: int = 1):
        self._maybe_die(step)
        return self.task.batch(step, part=part, parts=parts)


def read_run(out_dir) -> list[list[dict]]:
    """The logged steps of ``out_dir/run.jsonl`` split into attempts (a new one starts where the step goes back)."""
    attempts: list[list[dict]] = []
    last = None
    for line in Path(out_dir, "run.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" not in row:
            continue  # evaluations
        if last is None or row["step"] <= last:
            attempts.append([])
        attempts[-1].append(row)
        last = row["step"]
    return attempts
