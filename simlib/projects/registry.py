"""The projects, registered once. ``simlib train <name>`` (its choices, its ``--task.*`` flags and ``[task]``
table, its dry run), ``run_project``, the notebooks, the benchmarks and the grader all find a project here.

A project is a folder ``simlib/projects/<name>/`` whose ``run.py`` says what its standard run is:

    TASK                              the task dataclass (its fields are the --task.* flags and the [task] table)
    settings(quick) -> dict           task, optim, budget (steps/tokens/...; eval_every, target): the standard run
    plan_defaults(fields) -> dict     optional: plan fields the project sets unless given (vision: sync_batchnorm)
    train_rank(task, plan, **kw)      optional: what each rank runs (default ``simlib.train.train``; the GPT also
                                      samples text and saves its unsplit weights)
    finish(records, out, target)      optional: rank 0, after every plan ran (the GPT's loss plot)

and one line in :data:`PROJECTS` below registers it (:func:`register` does the same at run time, e.g. in a
test). More sizes than quick/full (a GPU preset) belong in the project's ``run.py`` beside ``settings``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Project", "PROJECTS", "register", "get"]


@dataclass(frozen=True)
class Project:
    name: str
    module: str  # "simlib.projects.<name>.run", or any importable module with the names above
    about: str = ""  # one line for `simlib train --help`
    folder_per_plan: bool = False  # default output results/<name>/<plan label>/ (else results/<name>/ itself)

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


def register(name: str, module: str, about: str = "", folder_per_plan: bool = False) -> Project:
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
register("vision", "simlib.projects.vision.run", "a ResNet on real handwritten digits", folder_per_plan=True)
register(
    "finance", "simlib.projects.finance.run", "deep hedging on paths calibrated to the S&P 500", folder_per_plan=True
)
