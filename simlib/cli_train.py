"""``simlib train``: the whole plan from flags and a TOML file, launcher-aware, with a dry run.

    simlib train gpt --quick                                   # spawns 2 local ranks (simlib.launch)
    simlib train gpt --config my_plan.toml --plan.zero-stage 2  # file, then flags (simlib.config)
    srun -n 2 simlib train gpt --quick                         # each task is one rank of SLURM's world
    torchrun --nproc-per-node 2 -m simlib train gpt --quick    # each worker is one rank of torchrun's world
    simlib train gpt --plan.tp 2 --dry-run                     # validate; mesh, memory, predicted step

:func:`resolve` turns the parsed arguments into a :class:`RunSpec` (project, world, plans, task, optimizer,
budget); :func:`run` executes it: under a launcher (``simlib.env.external_world``) as this rank, else on fresh
local processes. Only rank 0 writes shared files (run record, config.toml, loss.png, final weights).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import config as cfg
from .projects.registry import PROJECTS
from .projects.registry import get as project_of


@dataclass
class RunSpec:
    project: str
    world_size: int
    plans: dict  # folder name -> Plan
    folders: dict  # folder name -> Path
    task: object
    optim: object
    budget: dict  # train()'s budget keyword arguments
    quick: bool
    threads: int | None
    out: Path
    launcher: dict | None  # simlib.env.external_world(), or None (spawn locally)
    hardware: str = "cpu"
    backend: str = "auto"
    resume: bool = False
    timeout: float | None = None  # seconds a collective waits for a peer (a stopped rank ends the run then)
    config: dict = field(default_factory=dict)  # the resolved configuration per folder (what config.toml holds)
    size: str = "full"  # "quick", "full" or "gpu" (simlib.projects.gpu)
    size_reason: str = ""  # why, when simlib chose it (every rank has a GPU: the GPU size)
    holds: list = field(default_factory=list)  # checkpoint folders this run holds (simlib.checkpoint.hold)


def _project_defaults(project: str, size: str, world_size: int = 1) -> dict:
    """The project's standard task, optimizer, budget and plan fields at ``size`` (one source:
    ``projects.runner.project_settings``; the GPU size from ``projects.gpu``)."""
    from .projects.runner import project_settings

    spec = dict(project_settings(project, size, world_size))
    task, optim, plan = spec.pop("task"), spec.pop("optim"), spec.pop("plan", None) or {}
    return {"task": task, "optim": optim, "budget": spec, "plan": plan, "note": spec.pop("note", "")}


def _task_overrides(project: str, values: dict, defaults) -> object:
    if not values:
        return defaults
    cls = type(defaults)
    known = {f.name for f in cfg.fields("task")} & set(cfg.as_dict(defaults))
    wrong = sorted(set(values) - known)
    if wrong:
        raise ValueError(
            f"--task.{wrong[0].replace('_', '-')} is not a field of the {project} task ({cls.__name__}):"
            f" its fields are {', '.join(sorted(known))}"
        )
    return replace(defaults, **values)


def _build_plan(project: str, name: str, world: int, fields: dict, several: bool, checkpoints=None):
    """A named plan (``dp``, ``tp``...) on ``world`` ranks, then the ``[plan]`` fields over it. Given degrees
    replace the name's: ``--plan.tp 2`` on 4 ranks is dp 2 x tp 2 (dp fills the world; so does it for cp)."""
    from .plan import Plan, named_plan

    degrees = {k: fields[k] for k in ("dp", "tp", "pp", "cp") if k in fields}
    if degrees:
        if several:
            raise ValueError(
                "--plan.dp/--plan.tp/--plan.pp/--plan.cp describe one plan: give one --plan name with them"
            )
        tp, pp, cp = degrees.get("tp", 1), degrees.get("pp", 1), degrees.get("cp", 1)
        dp = degrees.get("dp", world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 1)
        base = dict(dp=dp, tp=tp, pp=pp, cp=cp)
        if pp > 1:
            base["accumulation"] = max(4, pp)
    else:
        base = cfg.as_dict(named_plan(name, world))
    base.update({k: v for k, v in project_of(project).plan_defaults(base).items() if k not in fields})
    if checkpoints is not None and fields.get("checkpoint_dir") is None:
        base["checkpoint_dir"] = str(checkpoints)  # saving or resuming, and no folder given: the run's own
        fields = {k: v for k, v in fields.items() if k != "checkpoint_dir"}
    return Plan(**{**base, **fields})


def resolve(args) -> RunSpec:
    """Defaults < ``--config`` file < flags, checked: every error is one ``ValueError`` line saying what to do."""
    from . import env
    from .train import OptimConfig

    file_layer = cfg.load(args.config) if getattr(args, "config", None) else {}
    run = file_layer.pop("run", {})
    flag_layer = cfg.from_args(args)
    project = args.project or run.get("project")
    if project is None:
        raise ValueError(
            f'name the project: simlib train {"|".join(PROJECTS)} (or project = "gpt" in the [run] table of --config)'
        )
    project_of(project)  # an unknown name: one line listing the registered ones
    if args.project and run.get("project") not in (None, args.project):
        raise ValueError(f"--config is for project {run['project']!r}, not {args.project!r}")
    given = cfg.merge(file_layer, flag_layer)
    plan_fields = given.get("plan", {})

    requested = args.world_size if args.world_size is not None else run.get("world_size")
    launcher = env.external_world()
    if launcher is not None:
        env.check_world_size(requested)
        world = launcher["world_size"]
    elif requested is not None:
        world = requested
    elif any(k in plan_fields for k in ("dp", "tp", "pp", "cp")):
        world = (
            plan_fields.get("dp", 1) * plan_fields.get("tp", 1) * plan_fields.get("pp", 1) * plan_fields.get("cp", 1)
        )
    else:
        world = 2
    if world < 1:
        raise ValueError(f"--world-size must be >= 1, got {world}")
    backend = getattr(args, "backend", None) or run.get("backend") or "auto"
    size, size_reason = cfg.pick_size(
        getattr(args, "size", None),
        run.pop("size", None),
        bool(args.quick or run.get("quick")),
        env.quick(),
        world,
        launcher["local_world_size"] if launcher else world,
        backend,
    )
    quick = size == "quick"
    defaults = _project_defaults(project, size, world)
    if defaults["note"] and not given.get("task", {}).get("corpus"):
        size_reason = "; ".join(r for r in (size_reason, defaults["note"]) if r)
    merged = cfg.merge({"optim": cfg.as_dict(defaults["optim"]), "budget": defaults["budget"]}, given)
    task = _task_overrides(project, given.get("task", {}), defaults["task"])
    if size == "gpu" and "corpus" in given.get("task", {}) and "target" not in given.get("budget", {}):
        target = project_of(project).gpu_target(task)  # the corpus given is not the one the default target was set on
        merged["budget"]["target"] = target if target is not None else merged["budget"].get("target")
    optim = OptimConfig(**merged["optim"])
    budget = cfg.as_dict(cfg.Budget(**merged["budget"]))
    names = args.plan or run.get("plan") or ["dp"]
    plan_fields = {**defaults["plan"], **plan_fields}  # the size's precision and accumulation, under the flags

    out = Path(args.out or run.get("out") or f"results/{project}")
    plans, folders = {}, {}
    for name in names:
        needs_folder = bool(args.resume or plan_fields.get("checkpoint_every"))
        plan = _build_plan(project, name, world, plan_fields, len(names) > 1, out if needs_folder else None)
        folder = out / name if len(names) > 1 else out
        if project_of(project).per_plan_folders and len(names) == 1 and not (args.out or run.get("out")):
            folder = out / (f"dp{world}" if name == "dp" and not plan_fields else plan.label.replace(" ", "_"))
        if needs_folder:
            plan = _build_plan(project, name, world, plan_fields, len(names) > 1, folder / "checkpoints")
        plan.validate(world, task)  # the plan against this world and this task: one line saying what would work
        plans[name], folders[name] = plan, folder
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {timeout!r}")
    spec = RunSpec(
        project,
        world,
        plans,
        folders,
        task,
        optim,
        budget,
        quick,
        args.threads if args.threads is not None else run.get("threads"),
        out,
        launcher,
        hardware=getattr(args, "hardware", None) or run.get("hardware") or "cpu",
        backend=backend,
        resume=bool(args.resume),
        timeout=getattr(args, "timeout", None),
        size=size,
        size_reason=size_reason,
    )
    for name, plan in plans.items():
        spec.config[name] = {
            "run": {
                k: v
                for k, v in dict(
                    project=project,
                    world_size=world,
                    plan=[name],
                    quick=quick,
                    threads=spec.threads,
                    out=str(folders[name]),
                    hardware=spec.hardware,
                    backend=spec.backend,
                ).items()
                if v is not None
            },
            "plan": cfg.as_dict(plan),
            "optim": cfg.as_dict(optim),
            "budget": budget,
            "task": {"size": size, **cfg.as_dict(task)},
        }
    return spec


def _check_checkpoints(spec: RunSpec) -> None:
    """A fresh run must not silently continue an old checkpoint: without ``--resume`` an existing one is an error.
    With ``--resume`` the newest one is loaded, or, when there is none yet (the first start of an elastic job
    whose command carries ``--resume`` for its restarts), the run starts at step 0 and says so."""
    from . import checkpoint

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    rank0 = spec.launcher is None or spec.launcher["rank"] == 0
    for plan in spec.plans.values():
        if not plan.checkpoint_dir:
            continue
        if rank0:  # the folder is this run's from here to the end (a second run gets a one-line error)
            spec.holds.append(checkpoint.hold(plan.checkpoint_dir, for_children=True))
        latest = checkpoint.latest(plan.checkpoint_dir)
        if latest is not None and not (spec.resume or restarted):
            raise ValueError(
                f"{plan.checkpoint_dir} holds a checkpoint ({latest.name}): add --resume to continue "
                "from it, or give another --out (or --plan.checkpoint-dir) to start afresh"
            )
        if spec.resume and rank0:
            what = (
                f"continuing from {latest}"
                if latest is not None
                else f"no checkpoint in {plan.checkpoint_dir} yet: starting at step 0"
            )
            print(f"--resume: {what}", flush=True)


def run(args) -> int:
    spec = resolve(args)
    if args.dry_run:
        from .dry_run import dry_run

        return dry_run(spec)
    _check_checkpoints(spec)
    if spec.launcher is not None:
        return _run_here(spec)
    return _run_local(spec)


def _save_config(spec: RunSpec, name: str) -> Path:
    path = spec.folders[name] / "config.toml"
    cfg.dump(
        spec.config[name],
        path,
        header=f"simlib train {spec.project}: the resolved configuration of this run."
        f"\nRepeat it with: simlib train --config {path}",
    )
    return path


def _report(spec: RunSpec, name: str, record) -> None:
    s = record.summary
    final = ", ".join(f"{k} {v:.4g}" for k, v in (s.get("final_eval") or {}).items())
    reached = f"reached after {s['time_to_target']:.1f} s" if s.get("target_reached") else "not reached"
    rate = (
        f"{s['tokens_per_s']:,.0f} tokens/s"
        if s.get("tokens_per_s")
        else f"{s['samples_per_s']:.0f} samples/s"
        if s.get("samples_per_s")
        else "no throughput (every step measured was warm-up, e.g. a short resumed run)"
    )
    print(f"  {rate}, held-out {final}; target {s.get('target')} {reached}")
    if s.get("samples_text"):
        print("  sample: " + repr(s["samples_text"][0]))


def _announce(spec: RunSpec, name: str, plan) -> None:
    where = (
        f"rank 0 of {spec.world_size} started by {spec.launcher['launcher']}"
        if spec.launcher
        else f"{plan.world_size} process(es)"
    )
    print(
        f"simlib train {spec.project}: plan {name} ({plan.label}) on {where}{' (quick)' if spec.quick else ''}"
        f" -> {spec.folders[name]}",
        flush=True,
    )
    if spec.size == "gpu" or spec.size_reason:
        print(f"  size {spec.size}" + (f": {spec.size_reason}" if spec.size_reason else " (asked for)"), flush=True)


def _finish(spec: RunSpec, records: dict) -> None:
    """Rank 0: what the project draws from every plan's run (the GPT's overlay plot), and where everything went."""
    wrote = project_of(spec.project).finish(records, spec.out, spec.budget.get("target"))
    for name in records:
        print(f"run record in {spec.folders[name]}/ (run.jsonl, summary.json, config.toml)")
    if wrote:
        print("wrote " + ", ".join(str(p) for p in wrote))


def _run_local(spec: RunSpec) -> int:
    """No launcher: fresh local ranks per plan through simlib.launch (the laptop path); one process runs here."""
    from .projects.runner import run_project

    records = {}
    for name, plan in spec.plans.items():
        _announce(spec, name, plan)
        _save_config(spec, name)
        records[name], _ = run_project(
            spec.project,
            plan.world_size,
            quick=spec.quick,
            out_dir=str(spec.folders[name]),
            threads=spec.threads,
            timeout=spec.timeout,
            plan=plan,
            task=spec.task,
            optim=spec.optim,
            **spec.budget,
        )
        _report(spec, name, records[name])
    _finish(spec, records)
    return 0


def _run_here(spec: RunSpec) -> int:
    """Under torchrun/srun: this process is one rank of the launcher's world; it trains, rank 0 writes."""
    import torch

    from . import env

    torch.set_num_threads(spec.threads or env.threads_per_worker(spec.launcher["local_world_size"]))
    ctx = env.init(spec.backend, **({"timeout": spec.timeout} if spec.timeout else {}))
    train_rank = project_of(spec.project).train_rank()
    records = {}
    try:
        for name, plan in spec.plans.items():
            if ctx.rank == 0:
                _announce(spec, name, plan)
                _save_config(spec, name)
            record = train_rank(spec.task, plan, out_dir=str(spec.folders[name]), optim=spec.optim, **spec.budget)
            records[name] = record
            if ctx.rank == 0:
                _report(spec, name, record)
        if ctx.rank == 0:
            _finish(spec, records)
    finally:
        env.shutdown()
    return 0


def scaling_here(args, sizes: dict) -> int:
    """``simlib scaling`` under torchrun/srun: measure the launcher's world size as this rank (rank 0 writes one
    row: step time, throughput, communication; speedup needs the 1-process run, which a fixed world cannot
    spawn, so the message says how to get it)."""
    import json

    import pandas as pd
    import torch

    from . import env, plots
    from .lessons import scaling as experiments
    from .timeline import summarize

    launcher = env.external_world()
    world = launcher["world_size"]
    if args.world_sizes is not None and sorted(set(args.world_sizes)) != [world]:
        raise ValueError(
            f"--world-sizes {' '.join(map(str, args.world_sizes))} but {launcher['launcher']} started "
            f"one world of {world}: under a launcher simlib scaling measures that world only (drop "
            "--world-sizes, or run simlib scaling without a launcher to sweep several)"
        )
    if sizes["global_batch"] % world:
        raise ValueError(
            f"--global-batch {sizes['global_batch']} does not split over {world} ranks: give a multiple of {world}"
        )
    torch.set_num_threads(args.threads)
    ctx = env.init()
    try:
        local_batch = sizes["global_batch"] // world
        out = experiments.dp_train(
            width=sizes["width"],
            depth=sizes["depth"],
            local_batch=local_batch,
            steps=sizes["steps"],
            warmup=sizes["warmup"],
            dp_variant=args.dp_variant,
        )
        if ctx.rank == 0:
            timeline = out["timeline"]
            row = experiments.scaling_row(
                summarize(timeline), timeline, world, args.threads, sizes["global_batch"], local_batch
            )
            table = pd.DataFrame([row])
            folder = Path(args.out)
            folder.mkdir(parents=True, exist_ok=True)
            stem = f"scaling_{args.mode}_world{world}"
            table.to_csv(folder / f"{stem}.csv", index=False)
            meta = dict(
                sizes, mode=args.mode, cores=env.cpu_count(), launcher=launcher["launcher"], nodes=launcher["nodes"]
            )
            (folder / f"{stem}.json").write_text(json.dumps({"config": meta, "rows": [row]}, indent=2, default=str))
            ax = plots.gantt(timeline, title=f"one step at world size {world} ({launcher['launcher']})")
            ax.figure.savefig(folder / f"{stem}_timeline.png", dpi=110, bbox_inches="tight")
            cols = [
                "world_size",
                "threads",
                "global_batch",
                "step_time",
                "step_time_iqr",
                "throughput",
                "comm_fraction",
            ]
            print(table[cols].to_string(index=False))
            print(
                f"\nwrote {folder / stem}.csv, .json, _timeline.png ({launcher['launcher']}, {world} ranks on "
                f"{launcher['nodes']} node(s)); speedup needs the 1-process reference: run "
                f"`simlib scaling --world-sizes 1` with the same sizes and divide the step times"
            )
    finally:
        env.shutdown()
    return 0
