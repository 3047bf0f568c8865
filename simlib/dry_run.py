"""``simlib train ... --dry-run``: check a run before starting it — the plan validated against the world and the
task, the rank grid with the node each rank lands on, the memory per rank and the simulator's step time.

Nothing is launched: the model is built once in this process to count its parameters; the memory and the step
time come from ``simlib.sim`` (``memory_per_device`` and ``predict``) on a hardware preset (``--hardware``).
"""

from __future__ import annotations

import dataclasses


def sim_model(task):
    """The task as ``simlib.sim`` sees it: its own ``sim_spec()``, or the GPT formulas for a GPT task."""
    from . import sim

    if hasattr(task, "sim_spec"):
        return task.sim_spec()
    if all(hasattr(task, k) for k in ("num_layers", "hidden", "num_heads", "seq_len")):
        if getattr(task, "moe_experts", 0):  # the MoE variant: every block's MLP a mixture of experts
            return sim.transformer(
                task.num_layers,
                task.hidden,
                task.num_heads,
                task.seq_len,
                task.config.vocab_size,
                experts=task.moe_experts,
                top_k=task.moe_top_k,
                capacity_factor=task.moe_capacity_factor,
                name=f"GPT {task.num_layers}x{task.hidden} MoE {task.moe_experts}",
            )
        spec = sim.gpt(
            task.num_layers,
            task.hidden,
            task.num_heads,
            seq_len=task.seq_len,
            vocab=task.config.vocab_size,
            name=f"GPT {task.num_layers}x{task.hidden}",
        )
        return dataclasses.replace(spec, dropout=False)  # the course GPT has no dropout (simlib/projects/gpt/model.py)
    raise ValueError(f"task {task.name!r} has no sim_spec(): the simulator cannot price it")


def strategy_for(plan, task, optim):
    """The simulator's :class:`simlib.sim.Strategy` for a trainer's :class:`simlib.train.Plan`: the one mapping,
    :meth:`Strategy.from_plan` (pipeline micro-batches, flushes, cp and ep included), with the optimizer."""
    from .sim import Strategy
    from .sim.planner import default_attention  # the planner's rule: a TOML it wrote is priced as it priced it

    optimizer = "adam" if optim.name == "adamw" else ("sgd_momentum" if optim.momentum else "sgd")
    attention = default_attention(plan.mixed_precision or "fp32")
    return Strategy.from_plan(plan, task.global_batch, optimizer=optimizer, attention=attention)


def mesh_lines(plan, local_world_size: int) -> list[str]:
    """The rank grid, group by group, with the node of each rank (``local_world_size`` ranks per node)."""
    mesh = plan.mesh
    node = lambda r: r // max(1, local_world_size)  # noqa: E731
    lines = [
        f"mesh dp={plan.dp} x pp={plan.pp} x cp={plan.cp} x tp={plan.tp} = {plan.world_size} ranks "
        f"(grid = arange(world).view(dp, pp, cp, tp)); {local_world_size} rank(s) per node"
    ]
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        if getattr(plan, axis) == 1:
            continue
        groups = mesh.groups_of(axis)
        spans = [len({node(r) for r in g}) > 1 for g in groups]
        where = (
            "every group inside one node" if not any(spans) else f"{sum(spans)} of {len(groups)} group(s) span nodes"
        )
        lines.append(f"  {axis} groups: {' '.join(str(g) for g in groups)}  ({where})")
    return lines


def dry_run(spec) -> int:
    from . import sim

    if spec.launcher is not None and spec.launcher["rank"] != 0:
        return 0  # every rank validated the same plan; rank 0 prints
    local = spec.launcher["local_world_size"] if spec.launcher else spec.world_size
    where = (
        f"{spec.launcher['launcher']}'s world of {spec.world_size} ({spec.launcher['nodes']} node(s))"
        if spec.launcher
        else f"{spec.world_size} local process(es), spawned by simlib.launch"
    )
    hw = sim.preset(spec.hardware)
    try:
        model, unpriced = sim_model(spec.task), ""
    except ValueError as exc:  # a project the simulator has no formulas for: validated and mapped, not priced
        model, unpriced = None, str(exc)
    print(f"simlib train {spec.project} --dry-run: nothing is started")
    print(f"world    {where}")
    if spec.size == "gpu" or spec.size_reason:  # as the run's own first lines say it
        print(f"size     {spec.size}" + (f": {spec.size_reason}" if spec.size_reason else " (asked for)"))
    print(
        f"task     {type(spec.task).__name__}: "
        + (f"{model.name}, {model.params:,} parameters (simulator's count)" if model else unpriced)
        + f", global batch {spec.task.global_batch}"
        + (
            f"; the MoE variant has {spec.task.config.num_parameters():,} ({spec.task.config.num_parameters(True):,}"
            " used per token)"
            if getattr(spec.task, "moe_experts", 0)
            else ""
        )
    )
    budget = {k: v for k, v in spec.budget.items() if v is not None}
    print(f"budget   {', '.join(f'{k}={v}' for k, v in budget.items())}")
    print(f"optim    {', '.join(f'{k}={v}' for k, v in dataclasses.asdict(spec.optim).items())}")
    for name, plan in spec.plans.items():
        changed = {
            f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if getattr(plan, f.name) != f.default
        }
        print(
            f"\nplan {name}: {plan.label}  (valid for this world and task)  "
            + ", ".join(f"{k}={v}" for k, v in changed.items())
        )
        for line in mesh_lines(plan, local):
            print("  " + line)
        if model is None:
            print(f"  memory and step time: not priced ({unpriced})")
            print(f"  output   {spec.folders[name]}/ (run.jsonl, summary.json, config.toml)")
            continue
        strategy = strategy_for(plan, spec.task, spec.optim)
        mem = sim.memory_per_device(model, strategy)
        where = (
            "the pipeline stage that needs the most"
            if strategy.pp > 1 and strategy.head == "whole"
            else "first pipeline stage"
        )
        print(
            f"  memory per rank (simulator, {where}): " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in mem.items())
        )
        try:
            p = sim.predict(model, hw, strategy, processes=min(local, hw.devices_per_node))
        except ValueError as exc:
            print(f"  predicted step on {hw.name}: not priced ({exc})")
        else:
            fits = "fits" if p.fits else "DOES NOT FIT"
            print(
                f"  predicted step on {hw.name}: {p.step_time * 1e3:.3g} ms (compute {p.compute * 1e3:.3g}, "
                f"exposed comm {p.exposed_comm * 1e3:.3g}, bubble {p.bubble * 1e3:.3g}, optimizer "
                f"{p.optimizer * 1e3:.3g}); memory {fits} in {hw.memory_bytes / 2**30:.0f} GiB"
            )
        print(
            f"  output   {spec.folders[name]}/ (run.jsonl, summary.json, config.toml)"
            + (f"; checkpoints in {plan.checkpoint_dir}" if plan.checkpoint_dir else "")
        )
    names = "|".join(sorted(sim.hardware_presets.PRESETS))
    print(
        f"\nthe prediction uses the {spec.hardware!r} preset (--hardware {names}); "
        "sim.calibrate() measures this machine for closer numbers"
    )
    return 0
