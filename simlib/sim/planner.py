"""Design a training run: every valid plan for a model on a cluster, priced by the simulator and ranked.

    result = sim.plan("llama3-70b", "h100", nodes=128, global_batch=1024)   # or a ModelSpec and a Hardware
    result.table()            # one row per plan that fits, fastest first (step time, tokens/s, MFU, memory)
    print(result.report())    # the best plans, where their time goes, and why the runners-up lose
    result.toml()             # the best plan ``simlib train`` runs, as ``simlib train --config`` reads it
    result.sbatch()           # a SLURM script that runs that TOML with torchrun

The search enumerates the degrees (``dp x tp x pp x cp``, with the context-parallel kind, and ``ep`` for an MoE
model), the ZeRO stage and FSDP, the recomputation policy, the micro-batch size, the pipeline schedule and its
virtual stages, and the overlap options. Nothing here decides what is valid: each candidate is a
:class:`~simlib.sim.Strategy` (its constructor and :meth:`Strategy.validate` refuse what cannot run on this
model and machine), and whether the trainer runs it is asked of :meth:`simlib.train.Plan.validate` and
:meth:`Strategy.from_plan` (the trainer's own check and the one mapping from a Plan to a Strategy). Refusals are
counted by their message. A plan whose memory per GPU exceeds the limit is dropped before it is priced (the
memory formula costs microseconds, the step time milliseconds) and kept with the bytes it lacks.

Pricing is :func:`simlib.sim.predict`'s, term for term, with its expensive parts — one micro-batch of a pipeline
stage (:func:`~simlib.sim.cost.gpt_stage`), the data-parallel sync, FSDP's traffic, the pipeline messages, the
optimizer — computed once per distinct set of the fields they read (:mod:`simlib.sim.planner_cost`). The top
plans are priced again by ``predict`` itself and must agree to 1e-9; if they do not (the simulator changed),
every plan is priced by ``predict`` and the result says so.

``plan(..., top=k)`` wants only the k fastest: layouts are visited by a lower bound on their step time (their
compute and the collectives nothing hides, :meth:`FastPricer.floor`; then the stage without recomputation,
:meth:`FastPricer.bound`) and the search stops where the bound passes the k-th best found, with the same first k
plans, order and times as the full search (``tests/test_planner.py`` holds it to that). ``space`` also narrows
the degrees (``"tp": 8``, ``"max_pp": 4``: ``simlib plan --tp 8 --max-pp 4``), checked by the trainer's ``Plan``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time

from .plan_result import PlanResult, resolve_hardware, resolve_model
from .planner_cost import FastPricer, divisors, label  # noqa: F401 - label: lesson 13 and the benchmarks call planner.label
from .planner_trainer import _first_line, _trainer_bucket_bytes, trainer_plan


def degree_options(world: int, model, hardware) -> tuple[list[tuple], list[str]]:
    """(dp, tp, pp, cp, ep) tuples whose product dp·tp·pp·cp uses every device, and notes on the search.

    ep adds no ranks: it shares the experts of an MoE model over ranks that already hold tokens. Every divisor
    of tp·dp·cp is offered and :class:`~simlib.sim.Strategy` keeps the ones it accepts (a divisor of dp·cp, or
    Megatron's MoE parallel folding: a multiple of dp·cp that divides tp·dp·cp) and the experts split over;
    the others are counted as refused, with Strategy's message. A dense model gets ep = 1 only."""
    moe = bool(getattr(model, "experts", 0))
    out = []
    for tp in divisors(world):
        for pp in divisors(world // tp):
            rest = world // (tp * pp)
            for cp in divisors(rest):
                dp = rest // cp
                for ep in divisors(tp * dp * cp) if moe else [1]:
                    out.append((dp, tp, pp, cp, ep))
    return out, []


def candidates(model, hardware, world: int, global_batch: int, space: dict | None = None):
    """Every combination of the searched fields, unvalidated, grouped by layout: (layout, [knobs]) where a
    layout is the degrees, micro-batching and schedule, and the knobs are ZeRO/FSDP, recomputation and
    overlaps (keyword dicts for :class:`Strategy`, to merge)."""
    space = dict(space or {})
    zero = space.get("zero_stage", (0, 1, 2, 3))
    recompute = space.get("recompute", ("none", "selective", "full"))
    fsdp_opts = space.get("fsdp", (False, True))
    schedules = space.get("schedule", ("1f1b", "gpipe", "interleaved"))
    max_v = space.get("max_virtual_stages", 8)
    sp_opts = space.get("sequence_parallel", (False, True))
    tpo_opts = space.get("tp_overlap", (False, True))
    overlap_opts = space.get("overlap", (True, False))
    # the distributed optimizer's all-gather under the next forward (ZeRO 1/2 without FSDP only; off by default:
    # simlib's trainer does not run it, Megatron's recipes do)
    pgo_opts = space.get("param_gather_overlap", (False,))
    max_mb = space.get("max_micro_batch", 64)
    counts = space.get("num_micro_batches")  # None: every count that divides the batch
    fixed = space.get("fixed", {})
    cp_kinds = space.get("cp_kind", ("allgather", "ring", "ulysses"))
    # rank orders: simlib's mesh (dp, pp, cp, tp) and Megatron-LM's (pipeline outermost: data- and expert-parallel
    # groups tp·cp ranks apart, inside a node where they fit); a fixed order wins
    orders = (False,) if "pipeline_outer" in fixed else space.get("pipeline_outer", (False,))
    degrees, notes = degree_options(world, model, hardware)
    for dp, tp, pp, cp, ep in filter(narrowing(space), degrees):
        if global_batch % dp:
            continue  # a data-parallel rank needs whole samples: not a plan, not counted as refused
        per_rank = global_batch // dp
        extra = {k: v for k, v in (("cp", cp), ("ep", ep)) if v > 1}
        kinds = [dict(cp_kind=k) for k in cp_kinds] if cp > 1 else [{}]
        for mb in divisors(per_rank):
            if mb > max_mb:
                continue
            m = per_rank // mb
            if counts is not None and m not in counts:
                continue
            scheds = (
                [("1f1b", 1)]
                if pp == 1
                else [
                    (sc, v)
                    for sc in schedules
                    for v in ([1] if sc != "interleaved" else depths(model.layers, pp, max_v))
                ]
            )
            for (sched, v), kind, outer in itertools.product(scheds, kinds, orders):
                layout = dict(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    micro_batch=mb,
                    num_micro_batches=m,
                    schedule=sched,
                    virtual_stages=v,
                    **extra,
                    **kind,
                    **(uneven_stages(model.layers, pp) if v == 1 else {}),
                    **({"pipeline_outer": True} if outer else {}),
                    **fixed,
                )
                knobs = [
                    dict(zero_stage=z, fsdp=fsdp, recompute=rc, overlap=ov, sequence_parallel=sp, tp_overlap=tpo)
                    | ({"param_gather_overlap": True} if pgo else {})
                    for z, rc in itertools.product(zero, recompute)
                    for fsdp in fsdp_opts
                    if not (fsdp and (z < 2 or dp == 1))
                    for ov in (overlap_opts if dp > 1 and not fsdp else (True,))
                    for pgo in (pgo_opts if z in (1, 2) and not fsdp and dp * cp > 1 else (False,))
                    for sp in (sp_opts if tp > 1 else (False,))
                    for tpo in (tpo_opts if sp else (False,))
                ]
                yield layout, knobs


def default_attention(dtype: str) -> str:
    """The attention kernel a plan of ``dtype`` is priced with when none is named: the fused one ("flash") in 16
    bits, where ``scaled_dot_product_attention`` (the course GPT's, ``simlib.models``) runs FlashAttention on a
    GPU; the unfused one in fp32. ``simlib train --dry-run`` prices a plan with the same rule."""
    return "unfused" if dtype == "fp32" else "flash"


def depths(layers: int, pp: int, max_v: int) -> list[int]:
    """Every interleaving depth v (2..max_v) whose pp·v model chunks split the layers evenly, counting the
    embedding and the loss as a layer each where that makes them split (Megatron-LM's
    account_for_embedding/loss_in_pipeline_split: 126 + 2 layers into 8 × 8 chunks) — what Strategy accepts."""
    return [v for v in range(2, max_v + 1) if layers % (pp * v) == 0 or (layers + 2) % (pp * v) == 0]


def uneven_stages(layers: int, pp: int) -> dict:
    """pp > 2 stages that do not split the layers evenly: Megatron-LM's split counting the embedding and the loss
    as a layer each (``--decoder-first/last-pipeline-num-layers``: Llama 3 405B's 126 layers on 16 stages as
    7, 8 × 14, 7), where it divides; {} otherwise (an even split, or none)."""
    if pp <= 2 or layers % pp == 0 or (layers + 2) % pp:
        return {}
    ends = (layers + 2) // pp - 1
    return dict(first_stage_layers=ends, last_stage_layers=ends) if ends >= 1 else {}


DEGREES = ("dp", "tp", "pp", "cp", "ep")


def narrowing(space: dict):
    """A test on (dp, tp, pp, cp, ep) from ``space``'s fixed degrees (``"tp": (4,)`` or ``"tp": 4``) and caps
    (``"max_pp": 8``)."""
    only = {d: (space[d],) if isinstance(space.get(d), int) else space.get(d) for d in DEGREES}
    caps = {d: space.get("max_" + d) for d in DEGREES}

    def keep(degrees) -> bool:
        return all(
            (only[d] is None or v in only[d]) and (caps[d] is None or v <= caps[d]) for d, v in zip(DEGREES, degrees)
        )

    return keep


def check_narrowing(space: dict, devices: int, model, hardware) -> None:
    """Refuse, with the trainer's Plan's own words, a narrowing that no plan can meet: a degree or ZeRO stage of
    the wrong type or range (``Plan``'s construction), or fixed degrees that do not fit the world
    (``Plan.validate``). The planner then searches only what is left."""
    from ..plan import Plan

    fixed = {}
    for d in DEGREES:
        values = space.get(d)
        values = (values,) if isinstance(values, int) else values
        for v in values or ():
            Plan(**{d: v})  # an int >= 1 (raises with the Plan's message)
        if values and len(values) == 1:
            fixed[d] = values[0]
        cap = space.get("max_" + d)
        if cap is not None:
            Plan(**{d: cap})
    for z in space.get("zero_stage", ()):
        Plan(zero_stage=z)
    if not any(filter(narrowing(space), degree_options(devices, model, hardware)[0])):
        if fixed:  # the Plan's rule says why (the degrees multiply to the world, ep divides dp x cp, ...)
            Plan(**{"dp": max(1, devices // math.prod(v for d, v in fixed.items() if d != "ep")), **fixed}).validate(
                devices
            )
        asked = ", ".join(f"{k}={v}" for k, v in space.items() if k in DEGREES or k[4:] in DEGREES)
        raise ValueError(
            f"no split of {devices} devices meets {asked}: the degrees dp x tp x pp x cp multiply to "
            f"{devices} (ep divides tp x dp x cp)"
        )


def gemm_shapes(model, devices: int, global_batch: int, task=None, space: dict | None = None) -> list:
    """Every (m, k, n) GEMM shape the trainer-runnable plans of ``model`` on ``devices`` CPU processes run, to hand
    :func:`simlib.sim.calibrate` (``gemm_shapes=``) before planning on the calibrated machine: the plans are found
    with the uncalibrated CPU preset (which plans are valid does not depend on the rates)."""
    from .calibrate import model_gemm_shapes
    from .hardware_presets import cpu_box

    draft = plan(
        model, cpu_box(), devices=devices, global_batch=global_batch, task=task, trainer_only=True, space=space
    )
    return model_gemm_shapes(model, [e["strategy"] for e in draft.ranked])


def plan(
    model,
    cluster="h100",
    nodes: int | None = None,
    devices: int | None = None,
    global_batch: int = 1024,
    seq_len: int | None = None,
    memory_limit: float | None = None,
    dtype: str | None = None,
    attention: str | None = None,
    task=None,
    trainer_only: bool = False,
    space: dict | None = None,
    processes: int | None = None,
    check: int = 5,
    exact: bool = False,
    top: int | None = None,
    pricer: FastPricer | None = None,
) -> PlanResult:
    """Enumerate, validate, price and rank every plan of ``model`` on ``cluster``.

    model: a ModelSpec or a name (``"8B"``, ``"70B"``, ``"405B"``, ``"llama3-70b"``, ``"7B"``); cluster: a
    preset name (``"h100"``, ``"a100"``, ``"cpu"``) or a Hardware (``sim.calibrate(cluster)`` for this machine);
    the world is ``devices`` or ``nodes`` x the preset's devices per node. global_batch: samples (sequences) per
    optimizer step. memory_limit: bytes per device (default 90 % of the device's, predict's rule; a value below
    1e4 is read as GB). task: a project's task (``simlib train`` runs the chosen plan: validated with
    ``Plan.validate(world, task)``); trainer_only: keep only plans ``simlib train`` runs. space: narrow or widen
    the search (``zero_stage``, ``recompute``, ``fsdp``, ``schedule``, ``max_virtual_stages``,
    ``sequence_parallel``, ``tp_overlap``, ``overlap``, ``max_micro_batch``, ``num_micro_batches``, ``cp_kind``;
    a degree's values, ``"tp": 4`` or ``"pp": (1, 2)``, and caps, ``"max_pp": 8``, for dp, tp, pp, cp, ep,
    checked by the trainer's ``Plan``; ``fixed``: Strategy fields for
    every plan, e.g. ``optimizer``). check: how many of the top plans are re-priced by ``sim.predict``.
    top: rank only the ``top`` fastest plans (the same plans, times and order as the full search's first
    ``top``): layouts are visited by a lower bound on their step time (:meth:`FastPricer.floor`, their compute
    alone) and the search stops where that bound passes the k-th best step found; ``too_big`` then holds the
    over-memory plans of the layouts visited (every plan faster than the best is among them), and
    ``pruned`` counts the combinations never looked at. pricer: a :class:`FastPricer` of this model and machine
    whose caches outlive the search (lesson 13's explorer: :mod:`simlib.sim.fast_search`); default a new one.
    """
    from .strategy import Strategy

    start = time.perf_counter()
    model, hw = resolve_model(model, seq_len), resolve_hardware(cluster)
    if devices is None:
        devices = (nodes or 1) * hw.devices_per_node
    if nodes is not None and devices != nodes * hw.devices_per_node:
        raise ValueError(f"give nodes or devices, not both ({nodes} nodes x {hw.devices_per_node} != {devices})")
    for name, v in (("devices", devices), ("global_batch", global_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    limit = 0.9 * hw.memory_bytes if memory_limit is None else float(memory_limit)
    limit = limit * 1e9 if limit < 1e4 else limit
    dtype = dtype or ("fp32" if hw.name.lower().startswith("cpu") or hw.cores else "bf16")
    attention = attention or default_attention(dtype)
    space = dict(space or {})
    fixed = {"dtype": dtype, "attention": attention, **space.get("fixed", {})}
    fixed.setdefault("bucket_bytes", _trainer_bucket_bytes())  # the trainer's default bucket, as it runs
    if task is not None:  # the course's trainer runs it: Adam(W), and its GPT's head (Strategy.from_plan's)
        fixed.setdefault("optimizer", "adam")
        fixed.setdefault("head", "whole")
    space["fixed"] = fixed
    if task is not None and trainer_only:  # what the trainer has: no FSDP, selective recompute, interleaving
        space = {
            "fsdp": (False,),
            "recompute": ("none", "full"),
            "schedule": ("1f1b", "gpipe"),
            "tp_overlap": (False,),
            **space,
        }
    check_narrowing(space, devices, model, hw)
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"top must be an int >= 1 (or None: rank every plan), got {top!r}")
    pricer = pricer or FastPricer(model, hw, processes, exact=exact)
    trainer_cache: dict = {}
    ranked, too_big, refused, seen, duplicates = [], [], {}, set(), 0
    notes = list(degree_options(devices, model, hw)[1])
    tally = {"considered": 0}

    def valid_layouts():
        for index, (layout, knobs) in enumerate(candidates(model, hw, devices, global_batch, space)):
            tally["considered"] += len(knobs)
            # the layout first, every knob at its default: Strategy.validate reads only the layout, and no knob
            # makes a refused layout valid, so a refusal here is the refusal of each of its knob combinations
            try:
                base = Strategy(**layout).validate(devices, model, hw)
            except (ValueError, TypeError) as exc:
                key = _first_line(exc)
                refused[key] = refused.get(key, 0) + len(knobs)
                continue
            bound = 0.0
            if top is not None:  # the least step time any of its knobs can reach (FastPricer.floor)
                bound = min(
                    pricer.floor(base, tp_overlap=tpo, sequence_parallel=sp)
                    for sp, tpo in {(k["sequence_parallel"], k["tp_overlap"]) for k in knobs}
                )
            yield bound, index, layout, knobs, base

    layouts = valid_layouts()
    if top is not None:  # most promising first; the index keeps the search's own order among equals
        layouts = sorted(layouts, key=lambda x: x[:2])
    best_k: list = []  # the top-k step times so far, negated (a max-heap)
    pruned = 0
    for i, (bound, index, layout, knobs, base) in enumerate(layouts):
        # a plan slower than the k-th best by more than the ranking's rounding (4 digits) cannot enter the top
        # k; every later layout's bound is larger still
        if top is not None and len(best_k) == top:
            if bound > -best_k[0] * (1 + 1e-3):
                pruned += sum(len(x[3]) for x in layouts[i:])
                break
            variants = {(k["sequence_parallel"], k["tp_overlap"]) for k in knobs}
            if pricer.bound(base, variants) > -best_k[0] * (1 + 1e-3):  # this layout only
                pruned += len(knobs)
                continue
        for j, k in enumerate(knobs):
            try:
                s = Strategy(**layout, **k)  # the knobs' own rules (FSDP's stages, tp_overlap's needs, ...)
            except (ValueError, TypeError) as exc:
                key = _first_line(exc)
                refused[key] = refused.get(key, 0) + 1
                continue
            if s in seen:
                duplicates += 1
                continue
            seen.add(s)
            mem = pricer.memory(s)
            if mem["total"] > limit:
                too_big.append(dict(strategy=s, memory=mem, excess=mem["total"] - limit))
                continue
            if trainer_only:
                runnable, why = trainer_plan(s, global_batch, devices, task, trainer_cache)
                if runnable is None:
                    refused[why] = refused.get(why, 0) + 1
                    continue
            entry = pricer.price(s, global_batch)
            entry["memory"] = mem
            entry["_at"] = (index, j)
            ranked.append(entry)
            if top is not None:
                (heapq.heappush if len(best_k) < top else heapq.heappushpop)(best_k, -entry["step_time"])
    ranked.sort(key=lambda e: (_order(e), e.pop("_at")))  # ties: in the order an exhaustive search meets them
    priced = len(ranked)
    if top is not None:
        del ranked[top:]
    result = PlanResult(
        model,
        hw,
        devices,
        global_batch,
        limit,
        ranked,
        too_big,
        refused,
        notes,
        task=task,
        considered=tally["considered"],
        trainer_only=trainer_only,
        top=top,
        pruned=pruned,
        extra={"duplicates": duplicates, "pricer": pricer, "priced": priced, "trainer_cache": trainer_cache},
    )
    result.exact = pricer.exact or not _agrees(result, pricer, check)
    if result.exact and not pricer.exact:
        notes.append(
            "the fast pricing disagreed with sim.predict on a top plan: every plan re-priced by "
            "sim.predict (slower; the simulator changed since simlib.sim.planner_cost was written)"
        )
        exact_pricer = result.extra["pricer"] = FastPricer(model, hw, processes, exact=True)
        for r in ranked:
            r.update(exact_pricer.price(r["strategy"], global_batch))
        ranked.sort(key=_order)
    result.seconds = time.perf_counter() - start
    return result


def _order(entry):
    """Fastest first; plans within 1e-4 of each other in step time: the fewer knobs turned, then less memory."""
    s = entry["strategy"]
    knobs = (
        (s.zero_stage > 0)
        + s.fsdp
        + (s.recompute != "none")
        + s.sequence_parallel
        + s.tp_overlap
        + (s.virtual_stages > 1)
        + (not s.overlap)
    )
    return (float(f"{entry['step_time']:.4e}"), knobs, entry["memory"]["total"])


def _agrees(result, pricer, check: int) -> bool:
    """The fast path against ``sim.predict`` itself on the top ``check`` plans (and the last one)."""
    picks = result.ranked[:check] + result.ranked[-1:]
    for r in picks:
        want = pricer.predict(r["strategy"]).step_time
        if not math.isclose(r["step_time"], want, rel_tol=1e-9):
            return False
    return True
