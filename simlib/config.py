"""A run's whole configuration from the command line and TOML files, generated from the dataclasses.

``simlib train`` reads four sections, each the fields of one dataclass (the one source of truth: a field added
to ``Plan`` later gets its flag and its TOML key by itself):

=========  ==============================  =====================================================
section    dataclass                       flag / TOML key
=========  ==============================  =====================================================
plan       ``simlib.train.Plan``           ``--plan.zero-stage 2``      ``[plan] zero_stage = 2``
optim      ``simlib.train.OptimConfig``    ``--optim.lr 3e-3``          ``[optim] lr = 3e-3``
budget     :class:`Budget` (``train()``)   ``--budget.steps 200``       ``[budget] steps = 200``
task       the projects' task dataclasses  ``--task.global-batch 64``   ``[task] global_batch = 64``
=========  ==============================  =====================================================

Precedence, as in torchtitan: the project's defaults, then the ``--config`` file, then the flags. The resolved
configuration is written back as TOML beside the run's outputs (:func:`dump`), so a run is repeated with
``simlib train --config results/gpt/config.toml``. A value of ``none`` (flag or TOML string) sets an optional
field to None (TOML has no null).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NOT_FROM_CLI = (
    "task",
    "plan",
    "optim",
    "out_dir",
    "verbose",
    "state_type",
    "step_hook",
    "pieces",  # the learner's code at a project's slots: Python objects, from a notebook or a script
)  # train() arguments set otherwise


@dataclass(frozen=True)
class Budget:
    """How long a run trains and what it records: ``simlib.train.train``'s keyword arguments, as fields
    (``tests/test_cli_config.py`` keeps them in step with ``train()``)."""

    steps: int | None = None  # optimizer steps (give exactly one of steps, tokens, samples, seconds)
    tokens: int | None = None  # tokens to train on (steps = tokens / (global batch x tokens per sample))
    samples: int | None = None  # samples to train on
    seconds: float | None = None  # training time; rank 0's clock decides when to stop
    eval_every: int = 0  # evaluate every k steps and at the end (0: never)
    log_every: int = 10  # a run.jsonl row every k steps
    target: dict | None = None  # e.g. eval_loss=4.5: the summary records when it is first reached
    stop_at_target: bool = False  # end the run at the first evaluation that reaches the target
    warmup: int = 2  # first steps left out of throughput
    measure_memory: bool = True  # CPU: profile the second step's allocations for its peak
    nonfinite: str = "stop"  # a step with NaN/inf loss or gradients: "stop" (error naming it) or "skip"
    allow_changes: tuple = ()  # on resume, fields allowed to differ from the checkpoint ("optim.lr", "*")

    BUDGETS = ("steps", "tokens", "samples", "seconds")


def task_classes() -> dict:
    """The projects' task dataclasses, by project name (each registered project's ``TASK``)."""
    from .projects.registry import PROJECTS

    return {name: project.task_class for name, project in PROJECTS.items()}


def sections() -> dict:
    """Section name -> the dataclasses whose fields it holds (several for ``task``: their union)."""
    from .train import OptimConfig, Plan

    return {"plan": (Plan,), "optim": (OptimConfig,), "budget": (Budget,), "task": tuple(task_classes().values())}


@dataclass(frozen=True)
class Field:
    section: str
    name: str
    type: object  # the evaluated annotation, e.g. int, str | None, tuple
    default: object
    help: str

    @property
    def flag(self) -> str:
        return f"--{self.section}.{self.name.replace('_', '-')}"

    @property
    def dest(self) -> str:
        return f"{self.section}.{self.name}"


def _comments(cls) -> dict:
    """The comment beside each field in the class's source (nanoGPT style): the flag's help."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found = {}
    for line in source.splitlines():
        m = re.match(r"^\s+(\w+)\s*:[^#]*#\s*(.*)$", line)
        if m and m.group(1) not in found:
            found[m.group(1)] = m.group(2).strip()
    return found


def fields(section: str | None = None) -> list[Field]:
    """Every configurable field, in declaration order (``task``: the union of the projects' tasks)."""
    out, seen = [], set()
    for name, classes in sections().items():
        if section is not None and name != section:
            continue
        for cls in classes:
            hints = typing.get_type_hints(cls)
            comments = _comments(cls)
            for f in dataclasses.fields(cls):
                if not f.init or (name == "task" and f.name == "name") or (name, f.name) in seen:
                    continue
                seen.add((name, f.name))
                default = (
                    f.default
                    if f.default is not dataclasses.MISSING
                    else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                )
                out.append(Field(name, f.name, hints.get(f.name, str), default, comments.get(f.name, "")))
    return out


# ---- values: one converter for flags and TOML ----
def _optional(tp) -> tuple[object, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            return (args[0] if len(args) == 1 else str), True
    return tp, False


def convert(field: Field, value):
    """A flag's string, or a TOML value, as the field's type (``ValueError`` naming the flag when it is not)."""
    tp, optional = _optional(field.type)
    origin = typing.get_origin(tp) or tp
    if isinstance(value, str) and value.strip().lower() in ("none", "null"):
        if optional:
            return None
        raise ValueError(f"{field.flag} cannot be none: give a {getattr(origin, '__name__', origin)}")
    try:
        if origin is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if origin is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value) if not isinstance(value, str) else int(value.replace("_", ""))
        if origin is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if origin is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if origin is tuple:
            items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v.strip()]
            kind = type(field.default[0]) if field.default else float
            return tuple(kind(v) for v in items)
        if origin is dict:
            if isinstance(value, dict):
                return {str(k): float(v) for k, v in value.items()}
            pairs = value if isinstance(value, (list, tuple)) else str(value).split(",")
            out = {}
            for pair in pairs:
                key, sep, val = str(pair).partition("=")
                if not sep:
                    raise ValueError(pair)
                out[key.strip()] = float(val)
            return out
        return ast.literal_eval(value) if isinstance(value, str) else value
    except (ValueError, TypeError, SyntaxError):
        kind = {tuple: "comma-separated numbers, e.g. 0.9,0.95", dict: "key=value pairs, e.g. eval_loss=4.5"}
        want = kind.get(origin, getattr(origin, "__name__", str(origin)))
        raise ValueError(
            f"{field.flag}: {value!r} is not a valid value: give {want}{' or none' if optional else ''}"
        ) from None


# ---- flags ----
def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of every section (``--plan.zero-stage``; ``--plan.zero_stage`` too, through
    :func:`normalize_argv`). A flag not
    given stays absent from the parsed namespace, so the config file and the project's defaults show through."""
    for section in sections():
        group = parser.add_argument_group(f"[{section}]", _SECTION_HELP[section])
        for f in fields(section):
            names = [f.flag]
            tp, _ = _optional(f.type)
            default = "" if f.default is None else f" (default {f.default!r})"
            helptext = (f.help or f.name) + default
            if (typing.get_origin(tp) or tp) is bool:
                group.add_argument(
                    *names, dest=f.dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=helptext
                )
            else:
                group.add_argument(
                    *names,
                    dest=f.dest,
                    default=argparse.SUPPRESS,
                    metavar=f.name.upper(),
                    nargs="+" if (typing.get_origin(tp) or tp) is dict else None,
                    help=helptext,
                )


_SECTION_HELP = {
    "plan": "how the work is split (simlib.train.Plan)",
    "optim": "optimizer and learning-rate schedule (simlib.train.OptimConfig)",
    "budget": "how long to train and what to record (simlib.train.train's arguments)",
    "task": "the project's model and data (its task dataclass; a field the project lacks is refused)",
}


def normalize_argv(argv: list[str]) -> list[str]:
    """``--plan.zero_stage`` (torchtitan's spelling) as ``--plan.zero-stage``; ``--no-plan.x_y`` likewise."""
    heads = tuple(f"--{p}{s}." for s in sections() for p in ("", "no-"))
    out = []
    for arg in argv:
        if arg.startswith(heads):
            name, eq, value = arg.partition("=")
            head, _, key = name.partition(".")
            arg = f"{head}.{key.replace('_', '-')}{eq}{value}"
        out.append(arg)
    return out


def from_args(args) -> dict:
    """The section fields given as flags: ``{"plan": {"zero_stage": 2}, ...}`` (converted)."""
    by_dest = {f.dest: f for f in fields()}
    out: dict = {}
    for dest, value in vars(args).items():
        if dest in by_dest:
            f = by_dest[dest]
            out.setdefault(f.section, {})[f.name] = convert(f, value)
    return out


# ---- TOML ----
RUN_KEYS = {
    "project": str,
    "world_size": int,
    "plan": list,
    "quick": bool,
    "threads": int,
    "out": str,
    "hardware": str,
    "backend": str,
}


def load(path) -> dict:
    """Read a TOML config: sections ``run``, ``plan``, ``optim``, ``budget``, ``task`` (values converted and
    checked; an unknown section or key is an error that names it and the nearest known one)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} not found")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    out: dict = {}
    known = {s: {f.name: f for f in fields(s)} for s in sections()}
    for section, values in raw.items():
        if section == "run":
            if not isinstance(values, dict):
                raise ValueError(f"{path}: [run] must be a table")
            for key, value in values.items():
                if key not in RUN_KEYS:
                    raise ValueError(f"{path}: unknown key {key!r} in [run]{_nearest(key, RUN_KEYS)}")
                if key == "plan" and isinstance(value, str):
                    value = [value]
                if key == "world_size" and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ValueError(f"{path}: [run] world_size must be an int, got {value!r}")
                out.setdefault("run", {})[key] = value
            continue
        if section not in known or not isinstance(values, dict):
            raise ValueError(f"{path}: unknown section [{section}]{_nearest(section, list(known) + ['run'])}")
        for key, value in values.items():
            if section == "task" and key == "size":  # the preset: quick, full or gpu (see pick_size)
                from .projects.gpu import SIZES

                if value not in SIZES:
                    raise ValueError(f"{path}: [task] size = {value!r}: use one of {', '.join(map(repr, SIZES))}")
                out.setdefault("run", {})["size"] = value
                continue
            if key not in known[section]:
                raise ValueError(f"{path}: unknown key {key!r} in [{section}]{_nearest(key, known[section])}")
            out.setdefault(section, {})[key] = convert(known[section][key], value)
    return out


def pick_size(
    flag: str | None,
    preset: str | None,
    quick: bool,
    env_quick: bool,
    world_size: int,
    local_world_size: int,
    backend: str = "auto",
) -> tuple[str, str]:
    """(size, why) of a run: ``--size`` wins, then ``[task] size`` of ``--config``, then ``--quick`` / ``[run]
    quick`` / ``SIMLIB_QUICK=1`` (quick); with none of them, "gpu" when every rank has a GPU of its own (said so:
    the reason is printed), else "full". ``why`` is "" when the caller chose."""
    from .projects.gpu import SIZES, auto_size

    for value, where in ((flag, "--size"), (preset, "[task] size")):
        if value is not None and value not in SIZES:
            raise ValueError(f"{where} {value!r}: use one of {', '.join(SIZES)}")
    chosen = flag or preset
    if chosen is not None:
        if quick and chosen != "quick":
            where = "--size" if flag else "[task] size"
            raise ValueError(
                f"--quick (or [run] quick = true) asks for the quick size, but {where} says {chosen!r}: "
                "give one of them"
            )
        if chosen == "gpu":  # asked for: run it, but never silently on CPU ranks
            fits, why = auto_size(world_size, local_world_size, backend)
            if fits != "gpu":
                return chosen, (
                    f"asked for, but {why}: the ranks run on the CPU, where one step of this size takes "
                    "minutes (--size full is the CPU size)"
                )
        return chosen, ""
    if quick or env_quick:
        return "quick", ""
    size, why = auto_size(world_size, local_world_size, backend)
    return size, (why if size == "gpu" else "")


def _nearest(word, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f": did you mean {close[0]!r}?" if close else f": known are {', '.join(sorted(options))}"


def merge(*layers: dict) -> dict:
    """Later layers win, key by key inside each section; a budget (steps/tokens/samples/seconds) given in a later
    layer replaces the earlier layers' budget as a whole (``train()`` takes exactly one)."""
    out: dict = {}
    for layer in layers:
        for section, values in layer.items():
            target = out.setdefault(section, {})
            if section == "budget" and any(k in values for k in Budget.BUDGETS):
                for k in Budget.BUDGETS:
                    target.pop(k, None)
            target.update(values)
    return out


def _toml_value(value) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if not (isinstance(value, float) and value != value) else '"nan"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return _toml_value(str(value))


def dump(config: dict, path=None, header: str = "") -> str:
    """The configuration as TOML (``None`` written as ``"none"``); written to ``path`` when given."""
    lines = [f"# {line}" for line in header.splitlines()] + ([""] if header else [])
    for section in ("run", *sections()):
        if section not in config:
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in config[section].items()]
        lines.append("")
    text = "\n".join(lines)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return text


def as_dict(obj) -> dict:
    """A dataclass instance's init fields (what :func:`dump` writes for plan, optim and task)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init and f.name != "name"}
