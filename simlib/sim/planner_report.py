"""What the planner says: where the time of the best plans goes, why the others lose, and the files that run one.

``report`` reads a :class:`~simlib.sim.plan_result.PlanResult`; ``toml`` writes the best plan ``simlib train`` runs
in the format ``simlib train --config`` reads (``simlib/config.py``: ``[run]``, ``[plan]``, ``[task]`` tables;
``tests/test_planner.py`` parses it back through ``simlib train``'s own resolver and compares the Plan);
``sbatch`` writes the SLURM script that runs that file with ``torchrun -m simlib train``.
"""

from __future__ import annotations

import dataclasses

from .planner_cost import FastPricer, label

SPLIT_TERMS = (
    ("compute", "compute"),
    ("recompute", "recomputation"),
    ("bubble", "pipeline bubble"),
    ("tp_comm", "exposed tp comm"),
    ("cp_comm", "exposed cp comm"),
    ("ep_comm", "exposed ep all-to-all"),
    ("pp_comm", "pp messages"),
    ("dp_exposed", "exposed dp/ZeRO sync"),
    ("embedding_sync", "embedding sync"),
    ("optimizer", "optimizer"),
)
# the terms as a figure draws them (simlib.widgets.planner_figure: one colour each): cp and ep comm within tp's
TERMS = tuple(
    (k, "exposed tp/cp/ep comm" if k == "tp_comm" else name)
    for k, name in SPLIT_TERMS
    if k not in ("cp_comm", "ep_comm")
)


def pricer_of(result) -> FastPricer:
    """The search's own pricer (its caches warm), or a new one for a result made elsewhere."""
    if "pricer" not in result.extra:
        result.extra["pricer"] = FastPricer(result.model, result.hardware, exact=result.exact)
    return result.extra["pricer"]


def terms(result, entry, split: bool = False) -> dict:
    """Seconds per step of each term (compute without its recomputation; the recomputation apart), in TERMS
    order; ``split``: the context- and expert-parallel collectives apart from tp's (SPLIT_TERMS order)."""
    again = pricer_of(result).recompute_time(entry["strategy"])
    out = {k: entry.get(k, 0.0) for k, _ in SPLIT_TERMS}
    out.update(compute=entry["compute"] - again, recompute=again)
    if not split:
        out["tp_comm"] += out.pop("cp_comm") + out.pop("ep_comm")
    return out


def where_time_goes(result, entry) -> str:
    t, step = terms(result, entry, split=True), entry["step_time"]
    shown = [f"{name} {t[k] / step:.0%}" for k, name in SPLIT_TERMS if t[k] / step >= 0.005]
    return ", ".join(shown)


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB" if abs(x) >= 1e8 else f"{x / 1e6:.2f} MB"


def why_slower(result, entry, best) -> str:
    a, b = terms(result, entry, split=True), terms(result, best, split=True)
    diffs = sorted(((a[k] - b[k], name) for k, name in SPLIT_TERMS), reverse=True)
    worse = [f"{name} +{d:.3g} s" for d, name in diffs if d > 0.01 * best["step_time"]][:3]
    better = [f"{name} {d:.3g} s" for d, name in diffs[::-1] if d < -0.01 * best["step_time"]][:1]
    return "; ".join(worse + better) or "the same terms within 1 %"


def other_layouts(result, n: int = 3) -> list[dict]:
    """The fastest plan of each other layout (dp, tp, pp[, cp, ep]), fastest first."""
    key = lambda s: (s.dp, s.tp, s.pp, getattr(s, "cp", 1), getattr(s, "ep", 1))  # noqa: E731
    won, seen, out = key(result.best["strategy"]), set(), []
    for r in result.ranked:
        k = key(r["strategy"])
        if k != won and k not in seen:
            seen.add(k)
            out.append(r)
    return out[:n]


def faster_but_too_big(result, n: int = 3) -> list[dict]:
    """Plans that would beat the best one but exceed the memory limit: per layout, the one closest to fitting."""
    if not result.too_big or not result.ranked:
        return []
    closest: dict = {}
    for r in result.too_big:
        s = r["strategy"]
        k = (s.dp, s.tp, s.pp, s.micro_batch, s.recompute)
        if k not in closest or r["excess"] < closest[k]["excess"]:
            closest[k] = r
    pricer = pricer_of(result)
    best, out = result.best["step_time"], []
    for r in sorted(closest.values(), key=lambda r: r["excess"])[:300]:
        priced = pricer.price(r["strategy"], result.global_batch)
        if priced["step_time"] < 0.995 * best:
            out.append({**r, **priced})
    return sorted(out, key=lambda r: r["step_time"])[:n]


def report(result, top: int = 3, alternatives: int = 3) -> str:
    m, hw = result.model, result.hardware
    lines = [
        f"{m.name}: {m.params / 1e9:.2f} B parameters, sequence {m.seq_len}; {result.world_size} x {hw.name} "
        f"({hw.devices_per_node} per node); global batch {result.global_batch} "
        f"({result.global_batch * m.seq_len:,} tokens); memory limit {_gb(result.memory_limit)} per device",
        f"searched {result.considered:,} combinations in {result.seconds:.2f} s "
        f"({result.plans_per_second:,.0f} per second): {len(result.ranked):,} valid and fit, "
        f"{len(result.too_big):,} valid but over the memory limit, {sum(result.refused.values()):,} refused "
        "by validation" + (" (priced by sim.predict)" if result.exact else ""),
    ]
    for msg, count in sorted(result.refused.items(), key=lambda kv: -kv[1])[:4]:
        lines.append(f"  refused {count:,} x: {msg}")
    lines += [f"  {note}" for note in result.notes]
    if not result.ranked:
        return "\n".join(lines + [result.nothing_fits()])
    lines.append("\nbest plans (fastest first):")
    from .planner_uncertainty import interval, plausibility
    from .planner_uncertainty import lines as uncertainty

    for i, r in enumerate(result.ranked[:top]):
        trainer = "simlib train runs it" if result.trainer(r) is not None else r["why_not_trainer"]
        lines.append(
            f"{i + 1}. {label(r['strategy'])}: step {r['step_time']:.4g} s, {r['tokens_per_s']:,.0f} "
            f"tokens/s, MFU {r['mfu']:.1%}, {_gb(r['memory']['total'])} per device ({trainer})"
        )
        band = interval(result, r)
        if band["high"] is not None:
            lines.append(f"   80 % interval {band['low']:.4g}–{band['high']:.4g} s per step")
        if plausibility(result, r):
            lines.append(f"   {plausibility(result, r)}")
        lines.append(f"   time: {where_time_goes(result, r)}")
    lines += uncertainty(result)
    best = result.best
    alts = other_layouts(result, alternatives)
    if alts:
        lines.append("\nthe best of other layouts, and why they lose:")
        for r in alts:
            lines.append(
                f"- {label(r['strategy'])}: {r['step_time'] / best['step_time'] - 1:+.1%} "
                f"({r['step_time']:.4g} s): {why_slower(result, r, best)}"
            )
    big = faster_but_too_big(result)
    if big:
        lines.append("\nfaster, but over the memory limit:")
        for r in big:
            lines.append(
                f"- {label(r['strategy'])}: {1 - r['step_time'] / best['step_time']:.1%} faster, needs "
                f"{_gb(r['memory']['total'])} per device, {_gb(r['excess'])} over the limit"
            )
    run = result.best_runnable
    if run is None:
        lines.append("\nno ranked plan runs under simlib train as it is (each needs a knob the trainer lacks)")
    elif run is not best:
        result.trainer(best)
        lines.append(
            f"\nbest plan simlib train runs: {label(run['strategy'])} "
            f"({run['step_time'] / best['step_time'] - 1:+.1%}); the best needs: "
            f"{best['why_not_trainer'].replace('simlib train has no knob for ', '')}"
        )
    return "\n".join(lines)


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (ties broken by position; no SciPy needed)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman needs two sequences of the same length >= 2, got {len(a)} and {len(b)}")

    def ranks(x):
        out = [0.0] * len(x)
        for pos, i in enumerate(sorted(range(len(x)), key=lambda i: x[i])):
            out[i] = float(pos)
        return out

    ra, rb = ranks(a), ranks(b)
    mean = (len(a) - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb))
    return cov / sum((x - mean) ** 2 for x in ra)


# ---- files ----
def _value(v) -> str:
    """A TOML value as ``simlib.config`` reads it (None is the string "none": TOML has no null)."""
    if v is None:
        return '"none"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def preset_name(hardware) -> str | None:
    """The preset ``hardware`` is (``simlib train --hardware``'s name for it), or None (a calibrated machine)."""
    from .hardware_presets import PRESETS

    return next((k for k, make in PRESETS.items() if make() == hardware), None)


def toml(result, entry=None, project: str = "gpt", steps: int | None = None) -> str:
    """``entry`` (default: the best plan ``simlib train`` runs) as a ``simlib train --config`` file."""
    entry = entry or result.best_runnable
    if entry is None or result.trainer(entry) is None:
        raise ValueError(
            "no ranked plan runs under simlib train as it is: widen the search "
            "(trainer_only=True keeps only those) or pick one with result.ranked[i]['plan']"
        )
    plan = entry["plan"]
    always = ("dp", "tp", "pp", "accumulation")  # simlib train fills a degree or accumulation that is absent
    changed = {
        f.name: getattr(plan, f.name)
        for f in dataclasses.fields(plan)
        if f.init and (getattr(plan, f.name) != f.default or f.name in always)
    }
    if result.task is not None:
        task = {
            f.name: getattr(result.task, f.name) for f in dataclasses.fields(result.task) if f.init and f.name != "name"
        }
        what = f"the {project} project's task"
    else:  # the GPT project at this model's shape: same width, depth, heads and context
        m = result.model
        task = dict(seq_len=m.seq_len, hidden=m.hidden, num_layers=m.layers, num_heads=m.heads)
        what = (
            f"the GPT project at {m.name}'s width, depth, heads and context (the project's GPT has "
            "LayerNorm, GeLU and full attention heads, and its own vocabulary)"
        )
    task["global_batch"] = result.global_batch
    s = entry["strategy"]
    header = [
        f"simlib plan: {label(s)} on {result.world_size} x {result.hardware.name}",
        f"predicted: step {entry['step_time']:.4g} s, {entry['tokens_per_s']:,.0f} tokens/s, MFU "
        f"{entry['mfu']:.1%}, {_gb(entry['memory']['total'])} per device",
        f"task: {what}",
        "run: simlib train --config THIS_FILE (under torchrun/srun: one rank per device)",
    ]
    run = dict(project=project, world_size=result.world_size)
    name = preset_name(result.hardware)
    if name:  # the dry run prices the plan on the machine the planner priced it on
        run["hardware"] = name
    sections = [("run", run), ("plan", changed), ("task", task)]
    if steps:
        sections.append(("budget", {"steps": steps}))
    lines = [f"# {h}" for h in header] + [""]
    for name, values in sections:
        lines.append(f"[{name}]")
        lines += [f"{k} = {_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def sbatch(result, config_path: str = "plan.toml", hours: int = 24, port: int = 29500) -> str:
    """A SLURM batch script: one torchrun agent per node, one rank per device, ``simlib train --config``."""
    hw = result.hardware
    per_node = min(hw.devices_per_node, result.world_size)
    nodes = result.world_size // per_node
    entry = result.best_runnable
    what = label(entry["strategy"]) if entry else "(no runnable plan)"
    gpus = "" if hw.cores else f"#SBATCH --gpus-per-node={per_node}\n"
    return (
        f"#!/bin/bash\n"
        f"# simlib plan: {result.model.name}, {what}, on {nodes} node(s) x {per_node} {hw.name} device(s)\n"
        f"#SBATCH --job-name=simlib-plan\n"
        f"#SBATCH --nodes={nodes}\n"
        f"#SBATCH --ntasks-per-node=1\n"
        f"{gpus}"
        f"#SBATCH --exclusive\n"
        f"#SBATCH --time={hours}:00:00\n"
        f"set -euo pipefail\n"
        f'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f'srun torchrun --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node {per_node} \\\n'
        f'    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$head_node:{port}" \\\n'
        f"    -m simlib train --config {config_path}\n"
    )
