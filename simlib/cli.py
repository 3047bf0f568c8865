"""Command line: ``simlib scaling`` (the main job), ``simlib doctor``, ``simlib run module:function``,
``simlib train <project>`` (the hands-on projects of ``simlib.projects.registry``), ``simlib plan`` (design a run)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path


def _doctor(args) -> int:
    from . import env

    info = env.describe()
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, str) and "\n" in value:  # the nvidia-smi matrix: print it under its key
            print(f"{key}:\n" + "\n".join("    " + line for line in value.splitlines()))
        else:
            print(f"{key:<{width}}  {value}")
    if info["launcher"] == "single":
        print(
            f"\nready: simlib.launch(fn, n) runs n local processes over "
            f"{info['default_backend']}; {info['cores']} core(s) -> {env.threads_per_worker(2, info['cores'])} "
            "thread(s) per worker at n=2"
        )
    return 0


def _grade(args) -> int:
    from .grading import batch

    rows = batch.grade(
        args.submissions,
        timeout=args.timeout,
        check_timeout=args.check_timeout,
        reuse=args.reuse_workers,
        journal=batch.journal_path(args.out),
        sandbox=args.sandbox,
    )
    if not rows:
        print("simlib grade: no notebooks found", file=sys.stderr)
        return 2
    paths = batch.write(rows, args.out)
    print(batch.format_summary(rows))
    print(
        f"\nwrote {paths['csv']} ({len(rows)} rows: one per submission and check), {paths['json']}, {paths['summary']}"
    )
    return 0


def _scaling(args) -> int:
    from . import env, plots
    from .env import quick
    from .lessons import scaling as experiments

    if args.quick or quick():
        defaults = dict(width=256, depth=2, global_batch=256, steps=5, warmup=2)
    else:
        defaults = dict(width=1024, depth=4, global_batch=1024, steps=20, warmup=3)
    for key in defaults:
        if getattr(args, key) is not None:
            defaults[key] = getattr(args, key)
    if env.external_world() is not None:  # torchrun / srun: this process is one rank of that world
        from .cli_train import scaling_here

        return scaling_here(args, defaults)
    if args.world_sizes is None:
        args.world_sizes = [1, 2, 4]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table, timelines = experiments.scaling(
        args.world_sizes,
        mode=args.mode,
        keep_timelines=True,
        threads_per_worker=args.threads,
        dp_variant=args.dp_variant,
        devices=args.devices,
        **defaults,
    )
    stem = f"scaling_{args.mode}"
    table.to_csv(out / f"{stem}.csv", index=False)
    meta = dict(table.attrs)
    (out / f"{stem}.json").write_text(
        json.dumps({"config": meta, "rows": json.loads(table.to_json(orient="records"))}, indent=2)
    )
    plots.scaling_figure(table, out / f"{stem}.png")
    biggest = max(w for w in timelines if w > 1) if len(timelines) > 1 else 1
    ax = plots.gantt(timelines[biggest], title=f"one step at world size {biggest}")
    ax.figure.savefig(out / f"{stem}_timeline.png", dpi=110, bbox_inches="tight")
    cols = [
        "world_size",
        "threads",
        "global_batch",
        "step_time",
        "step_time_iqr",
        "throughput",
        "speedup",
        "efficiency",
        "comm_fraction",
        "oversubscribed",
        "baseline",
    ]
    with __import__("pandas").option_context("display.width", 160, "display.float_format", "{:.4g}".format):
        print(table[cols].to_string(index=False))
    if meta.get("placement_note"):
        print(f"\n{meta['placement_note']}")
    print(
        f"\nwrote {out / stem}.png, {stem}_timeline.png, {stem}.csv, {stem}.json"
        f"  ({meta['cores']} cores; speedup is against 1 process x {args.threads} thread(s))"
    )
    return 0


def _load(target: str):
    if ":" not in target:
        raise SystemExit(f"simlib run: expected module:function, got {target!r}")
    module_name, fn_name = target.split(":", 1)
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        return getattr(module, fn_name)
    except AttributeError:
        raise SystemExit(f"simlib run: {module_name} has no function {fn_name!r}") from None


def _run(args) -> int:
    """Under torchrun or srun: join the group and call fn. Elsewhere: start --nproc-per-node local ranks."""
    from . import env
    from .launch import WorkerError, launch

    fn = _load(args.target)
    fn_args = args.args
    if env.detect_launcher() in ("torchrun", "slurm"):
        env.init(args.backend, timeout=args.timeout)
        result = fn(*fn_args)
        env.shutdown()
        return 0 if result is None or result is True or not isinstance(result, int) else int(result)
    try:
        results = launch(fn, args.nproc_per_node, *fn_args, backend=args.backend, timeout=args.timeout)
    except WorkerError as exc:
        print(f"simlib run: {exc}", file=sys.stderr)
        return 1
    for rank, value in enumerate(results):
        if value is not None:
            print(f"[rank{rank}] returned {value!r}")
    return 0


def _train(args) -> int:
    """Train a project under one or more plans (simlib.cli_train: flags/TOML, launcher-aware, --dry-run)."""
    from . import cli_train

    return cli_train.run(args)


def _plan(args) -> int:
    from . import cli_plan

    return cli_plan.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="torch version, backends, cores, GPUs, launcher detected")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("grade", help="grade submitted exercise notebooks; write CSV, JSON and a summary")
    p.add_argument("submissions", nargs="+", help="exercise notebooks, or folders searched for *.ipynb")
    p.add_argument(
        "--out", default="grades.csv", help="CSV of every row (default grades.csv; .json and _summary.csv beside it)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each notebook may run (default 300)")
    p.add_argument("--check-timeout", type=float, default=30.0, help="seconds each multi-process check may take")
    p.add_argument(
        "--reuse-workers",
        action="store_true",
        help="one set of worker processes for every submission, graded from this process "
        "(trusted classes only; default: a child process and fresh workers per submission)",
    )
    p.add_argument(
        "--sandbox",
        choices=["unshare"],
        default=None,
        help="each submission in new user/mount/network namespaces: no network, the course read-only, "
        "the submitted folders hidden (Linux)",
    )
    p.set_defaults(func=_grade)

    p = sub.add_parser("scaling", help="run a data-parallel scaling sweep; write PNG, CSV and JSON")
    p.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=None,
        help="default 1 2 4; under torchrun/srun the launcher's world only",
    )
    p.add_argument("--mode", choices=["strong", "weak"], default="strong")
    p.add_argument("--global-batch", type=int, default=None, help="samples per step (strong scaling)")
    p.add_argument("--width", type=int, default=None, help="MLP width (default 1024; 256 in quick mode)")
    p.add_argument("--depth", type=int, default=None, help="MLP hidden layers (default 4)")
    p.add_argument("--steps", type=int, default=None, help="measured steps (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps left out (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument(
        "--dp-variant",
        choices=["bucket", "flat", "naive", "ddp"],
        default="bucket",
        help="how gradients are averaged: bucket (overlapped with backward, as DDP; default), flat (one "
        "all-reduce after backward), naive (one per tensor), ddp (torch's)",
    )
    p.add_argument(
        "--devices",
        choices=["auto", "cpu", "gpu-shared", "gpus"],
        default="auto",
        help="where every world size runs, alike: cpu, gpus (one per rank, NCCL; stops at the GPU count), "
        "gpu-shared (all ranks on cuda:0 over Gloo); auto: cpu without a GPU, gpus when there is "
        "one per rank, else gpu-shared",
    )
    p.add_argument("--quick", action="store_true", help="small sizes (also SIMLIB_QUICK=1)")
    p.add_argument("--out", default="results", help="output folder (default ./results)")
    p.set_defaults(func=_scaling)

    p = sub.add_parser("run", help="run module:function on every rank (local, torchrun or srun)")
    p.add_argument("target", help="module:function, e.g. my_train:main")
    p.add_argument("args", nargs="*", help="string arguments passed to the function")
    p.add_argument("--nproc-per-node", type=int, default=2, help="local ranks when not under torchrun/SLURM")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait")
    p.set_defaults(func=_run)

    from .plan import PLAN_NAMES
    from .projects.registry import PROJECTS

    p = sub.add_parser(
        "train",
        help="hands-on project: "
        + ", ".join(f"{n} ({p.about})" if p.about else n for n, p in PROJECTS.items())
        + "; trained through simlib.train; writes the run record",
        description="Every field of Plan, OptimConfig, the budget and the task is a flag "
        "(--plan.zero-stage 2) and a key of the --config TOML file ([plan] zero_stage = 2); flags win "
        "over the file, the file over the project's defaults. Under torchrun or srun each process "
        "is one rank of the launcher's world.",
    )
    p.add_argument(
        "project",
        nargs="?",
        choices=list(PROJECTS),
        help='the project (or project = "gpt" in the [run] table of --config)',
    )
    p.add_argument("--config", default=None, help="TOML file: [run], [plan], [optim], [budget], [task] tables")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes (default 2, or the launcher's world under torchrun/srun, or dp x tp x pp x cp)",
    )
    p.add_argument(
        "--plan",
        nargs="+",
        default=None,
        choices=list(PLAN_NAMES),
        help="named plans (default dp); several write one folder each under --out; --plan.* fields "
        "apply on top (e.g. --plan.ep 2 --task.moe-experts 4: the GPT's MoE variant). vision and "
        "finance have no tp/pp/cp (refused)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads per process (default cores // local ranks)")
    p.add_argument("--quick", action="store_true", help="a small model and few steps (also SIMLIB_QUICK=1)")
    p.add_argument(
        "--size",
        default=None,
        choices=["quick", "full", "gpu"],
        help="quick, full (the CPU size) or gpu (simlib.projects.gpu: GPT-2's layout at hidden 1536, compiled, "
        "bf16/fp16); default: gpu when every rank has a GPU of its own, else full ([task] size in --config)",
    )
    p.add_argument("--out", default=None, help="output folder (default results/gpt; results/<project>/dp<N>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --plan.checkpoint-dir (default <out>/checkpoints)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the plan; print the mesh, the memory per rank and the simulator's step time; start nothing",
    )
    p.add_argument("--hardware", default=None, help="simulator preset the dry run predicts on (cpu, a100, h100)")
    p.add_argument(
        "--backend",
        default=None,
        choices=["auto", "gloo", "nccl"],
        help="under torchrun/srun: the process-group backend (default auto)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective waits for a peer: a stopped or lost rank ends the run then (default 60)",
    )
    from . import config as _config

    _config.add_flags(p)
    p.set_defaults(func=_train)
    from .projects.gpt import prepare as _prepare

    _prepare.add_parser(sub)  # simlib prepare gpt: the one step that downloads

    p = sub.add_parser(
        "plan",
        help="every valid plan of a model on a cluster, ranked by the simulator; writes the "
        "best as simlib train's TOML and an sbatch script",
    )
    from . import cli_plan

    cli_plan.add_arguments(p)
    p.set_defaults(func=_plan)
    return parser


def _one_line(exc: BaseException) -> str:
    """A library error as one line: its first line, and for a worker failure the failing rank and its cause."""
    from .errors import WorkerError, _cause, died_first

    if isinstance(exc, WorkerError) and getattr(exc, "failures", None):
        raised = [f for _, f in sorted(exc.failures.items()) if f.type_name not in ("WorkerDied", "Timeout")]
        if raised and not died_first(exc):  # the error a rank raised says what to do: keep it whole, on one line
            return f"rank {raised[0].rank}: {raised[0].type_name}: {' '.join(str(raised[0].message).split())}"
        return _cause(exc)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv=None) -> int:
    from .config import normalize_argv

    args = build_parser().parse_args(normalize_argv(sys.argv[1:] if argv is None else list(argv)))
    from .checkpoint import CheckpointError
    from .launch import Interrupted, WorkerError

    try:
        return args.func(args)
    except (ValueError, TypeError, FloatingPointError, CheckpointError, WorkerError, OSError) as exc:
        # the library's errors say what to do in their first line; a traceback would only bury it
        print(f"simlib {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"simlib {args.command}: interrupted ({exc})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
