"""``simlib plan``: the planner from the command line.

    simlib plan 70B --cluster h100 --nodes 128 --global-batch 1024          # a named shape on a preset cluster
    simlib plan gpt --cluster here --devices 4 --trainer-only               # the GPT project on this machine
    simlib plan 8B --nodes 8 --memory-gb 60 --out results/plan               # writes plan.toml, plan.sbatch, plans.csv
    simlib plan 70B --nodes 16 --tp 8 --max-pp 4 --zero 1 --no-recompute      # narrow the search (checked by Plan)
    simlib plan 405B --nodes 2048 --fastest 10                                # only the 10 fastest: a bounded search

Prints the report (best plans, where their time goes, why the others lose); writes the best plan ``simlib train``
runs as ``plan.toml`` (``simlib train --config plan.toml``), a SLURM script that runs it (``plan.sbatch``), and
every ranked plan (``plans.csv``).
"""

from __future__ import annotations

from pathlib import Path

from .projects import registry  # every registered project is a model simlib plan knows


def add_arguments(p) -> None:
    p.add_argument(
        "model",
        help="8B, 70B, 405B (Llama 3 shapes), a label of sim.LLAMA_SIZES / GPT_SIZES, or a registered "
        f"project ({', '.join(registry.PROJECTS)}: its task, validated as simlib train would)",
    )
    p.add_argument(
        "--cluster",
        default="h100",
        help="hardware preset (h100, a100, a100-40gb, cpu) or 'here' (calibrate this machine: about a minute)",
    )
    p.add_argument("--nodes", type=int, default=None, help="nodes of the preset (default 1)")
    p.add_argument("--devices", type=int, default=None, help="devices in all (instead of --nodes)")
    p.add_argument(
        "--global-batch", type=int, default=None, help="samples per step (default 1024; a project's own global batch)"
    )
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument(
        "--memory-gb", type=float, default=None, help="memory limit per device, GB (default 90 %% of the device's)"
    )
    p.add_argument("--trainer-only", action="store_true", help="only plans simlib train runs as they are")
    for d, what in (
        ("dp", "data-parallel"),
        ("tp", "tensor-parallel"),
        ("pp", "pipeline"),
        ("cp", "context-parallel"),
        ("ep", "expert-parallel"),
    ):
        p.add_argument(f"--{d}", type=int, default=None, help=f"fix the {what} degree")
        p.add_argument(f"--max-{d}", type=int, default=None, help=f"at most this {what} degree")
    p.add_argument("--zero", type=int, default=None, help="fix the ZeRO stage (0-3; 2 and 3 include FSDP's)")
    p.add_argument("--no-recompute", action="store_true", help="only plans without activation recomputation")
    p.add_argument("--top", type=int, default=3, help="plans explained (default 3)")
    p.add_argument(
        "--fastest",
        type=int,
        default=None,
        metavar="K",
        help="rank only the K fastest plans: the same plans, times and order as the full search's first "
        "K, found by a bounded search (seconds instead of a minute at 16,384 GPUs); plans.csv then "
        "holds those K",
    )
    p.add_argument("--quick", action="store_true", help="a project's quick size (also SIMLIB_QUICK=1)")
    p.add_argument("--out", default=None, help="folder for plan.toml, plan.sbatch and plans.csv (default: print only)")


def _project(name: str, quick: bool):
    """A registered project's task at its quick or full size, and its model as the simulator sees it (the task's
    ``sim_spec()``)."""
    from .dry_run import sim_model

    task = registry.get(name).size("quick" if quick else "full")["task"]
    return task, sim_model(task)


def narrowed(args) -> dict:
    """The search space the narrowing flags ask for (``plan``'s ``space``; checked there by the trainer's Plan)."""
    space = {}
    for d in ("dp", "tp", "pp", "cp", "ep"):
        if getattr(args, d, None) is not None:
            space[d] = (getattr(args, d),)
        if getattr(args, f"max_{d}", None) is not None:
            space[f"max_{d}"] = getattr(args, f"max_{d}")
    if getattr(args, "zero", None) is not None:
        space["zero_stage"] = (args.zero,)
    if getattr(args, "no_recompute", False):
        space["recompute"] = ("none",)
    return space


def run(args) -> int:
    from . import env
    from .sim.planner import gemm_shapes, plan

    task, model = None, args.model
    if args.fastest is not None and args.fastest < 1:
        raise ValueError(f"--fastest must be an int >= 1 (leave it out to rank every plan), got {args.fastest}")
    if args.model in registry.PROJECTS:
        task, model = _project(args.model, bool(args.quick or env.quick()))
    cluster = args.cluster
    gb = args.global_batch or (task.global_batch if task is not None else 1024)
    if cluster == "here":  # this box, measured: a project's GEMMs at its plans' own shapes, collectives in situ
        from .sim.calibrate import calibrate

        world = args.devices or 4
        shapes = gemm_shapes(model, world, gb, task=task, space=narrowed(args)) if task is not None else ()
        cluster = calibrate(
            world_sizes=tuple(w for w in (1, 2, 4, 8) if w <= world), kernels="comm", gemm_shapes=shapes
        )
    mem = args.memory_gb * 1e9 if args.memory_gb is not None else None
    result = plan(
        model,
        cluster,
        nodes=args.nodes,
        devices=args.devices,
        global_batch=gb,
        seq_len=args.seq_len,
        memory_limit=mem,
        task=task,
        trainer_only=args.trainer_only,
        space=narrowed(args),
        top=args.fastest,
    )
    print(result.report(top=args.top))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.table(1000).to_csv(out / "plans.csv", index=False)  # the fastest 1,000
        written = ["plans.csv"]
        if result.ranked and result.best_runnable is not None:
            (out / "plan.toml").write_text(result.toml(project=args.model if task is not None else "gpt"))
            (out / "plan.sbatch").write_text(result.sbatch(str(out / "plan.toml")))
            written += ["plan.toml", "plan.sbatch"]
        print(f"\nwrote {', '.join(str(out / w) for w in written)}")
    return 0 if result.ranked else 1
