"""The projects, registered once. ``simlib train <name>`` (its choices, its ``--task.*`` flags and ``[task]``
table, its dry run), ``run_project``, the notebooks, the benchmarks and the grader all find a project here.

A project is a folder ``simlib/projects/<name>/`` whose ``run.py`` declares everything about it:

    TASK                              the task dataclass (its fields are the --task.* flags and the [task] table;
                                      its ``sim_spec()`` is the model ``simlib plan`` and the dry run price)
    settings(quick) -> dict           task, optim, budget (steps/tokens/...; eval_every, target): the sizes
                                      "quick" and "full"
    gpu_settings(world_size, facts)   optional: the size "gpu" (the dict of ``settings`` plus ``plan``: Plan
                                      fields such as the precision, and ``note``); without it the GPU size is
                                      the full size, and the run says so in one line
    PIECES                            optional: {name: simlib.pieces.Slot}, where a learner's code can take the
                                      place of the course's own in this project's training (``pieces=``)
    MILESTONE                         optional: the graded milestone's spec (a dict, see
                                      :func:`simlib.grading.milestones.milestone`: the metric, the budget)
    FOLDER_PER_PLAN                   optional: True writes results/<name>/<plan label>/ by default (else
                                      results/<name>/ itself); ``register(..., folder_per_plan=)`` overrides it
    plan_defaults(fields) -> dict     optional: plan fields the project sets unless given (vision: sync_batchnorm)
    train_rank(task, plan, **kw)      optional: what each rank runs (default ``simlib.train.train``; the GPT also
                                      samples text and saves its unsplit weights)
    finish(records, out, target)      optional: rank 0, after every plan ran (the GPT's loss plot)

and one line in :data:`PROJECTS` below registers it (:func:`register` does the same at run time, e.g. in a
test). Everything that lists projects iterates :data:`PROJECTS`: ``simlib train`` and ``simlib plan``, the GPU
check, the GPU-size tests, the grader's milestones.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .gpu import SIZES

__all__ = ["Project", "PROJECTS", "SIZES", "register", "get"]


@dataclass(frozen=True)
class Project:
    name: str
    module: str  # "simlib.projects.<name>.run", or any importable module with the names above
    about: str = ""  # one line for `simlib train --help`
    folder_per_plan: bool | None = None  # results/<name>/<plan label>/ by default (None: the module's FOLDER_PER_PLAN)

    @property
    def run(self):
        """The project's ``run`` module (imported on first use: the registry itself costs nothing)."""
        return importlib.import_module(self.module)

    @property
    def task_class(self) -> type:
        return self.run.TASK

    def settings(self, quick: bool = False) -> dict:
        """A fresh copy of the standard run: task, optim and the budget keywords of ``train()``."""
        return dict(self.run.settings(quick))

    __call__ = settings  # PROJECTS[name](quick), as before the registry held Project values

    def gpu_target(self, task) -> dict | None:
        """The GPU size's target recomputed for ``task`` after ``--task.*`` overrides (a corpus given has its own):
        the module's ``gpu_target(task)``, or None when the project's target does not depend on the task."""
        recompute = getattr(self.run, "gpu_target", None)
        return recompute(task) if recompute else None

    @property
    def has_gpu_size(self) -> bool:
        return hasattr(self.run, "gpu_settings")

    def size(self, size: str = "full", world_size: int = 1, facts: list | None = None) -> dict:
        """A fresh copy of the run at ``size``: "quick", "full" (:meth:`settings`) or "gpu" (the module's
        ``gpu_settings(world_size, facts)``; ``facts``: :func:`simlib.projects.gpu.gpu_facts`, given in tests).
        A project without a GPU size runs its full size there, with a ``note`` saying so."""
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}: use one of {', '.join(SIZES)}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if size != "gpu":
            return self.settings(size == "quick")
        if not self.has_gpu_size:
            spec = self.settings(False)
            spec["note"] = (
                f"project {self.name} declares no GPU size (gpu_settings in {self.module}): its full size runs"
            )
            return spec
        return dict(self.run.gpu_settings(world_size, facts))

    @property
    def milestone(self) -> dict | None:
        """The graded milestone's spec (the module's ``MILESTONE``), or None."""
        spec = getattr(self.run, "MILESTONE", None)
        return dict(spec) if spec is not None else None

    @property
    def pieces(self) -> dict:
        """The slots where a learner's code can run in this project's training (the module's ``PIECES``:
        ``{name: simlib.pieces.Slot}``), or {} for none."""
        return dict(getattr(self.run, "PIECES", {}) or {})

    @property
    def per_plan_folders(self) -> bool:
        if self.folder_per_plan is not None:
            return self.folder_per_plan
        return bool(getattr(self.run, "FOLDER_PER_PLAN", False))

    def plan_defaults(self, fields: dict) -> dict:
        """Plan fields this project sets for a plan with ``fields`` (dp, tp, ...) unless the caller gives them."""
        hook = getattr(self.run, "plan_defaults", None)
        return dict(hook(fields)) if hook else {}

    def train_rank(self):
        """What every rank runs: ``train_rank(task, plan, out_dir=..., **train_kwargs) -> RunRecord``."""
        hook = getattr(self.run, "train_rank", None)
        if hook is None:
            from ..train import train

            return train
        return hook

    def finish(self, records: dict, out, target=None) -> list:
        """Rank 0, after every plan: what the project draws from all its runs; the paths it wrote."""
        hook = getattr(self.run, "finish", None)
        return list(hook(records, out, target) or []) if hook else []


PROJECTS: dict[str, Project] = {}


def register(name: str, module: str, about: str = "", folder_per_plan: bool | None = None) -> Project:
    """Add (or replace) project ``name``: the one line a new project needs."""
    if not name.isidentifier():
        raise ValueError(f"a project name is a Python identifier (it names a folder and a flag), got {name!r}")
    PROJECTS[name] = Project(name, module, about, folder_per_plan)
    return PROJECTS[name]


def get(name: str) -> Project:
    if name not in PROJECTS:
        raise ValueError(f"unknown project {name!r}: use one of {', '.join(PROJECTS)}")
    return PROJECTS[name]


register("gpt", "simlib.projects.gpt.run", "a small GPT on real English text")
register("vision", "simlib.projects.vision.run", "a ResNet on real handwritten digits")
register("finance", "simlib.projects.finance.run", "deep hedging on paths calibrated to the S&P 500")
