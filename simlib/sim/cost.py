"""The cost model: α-β collectives, GEMM-size-aware compute, and a training step's time.

A GPT is priced operator by operator (``layer``: GEMMs, memory-bound kernels, tensor-parallel collectives) and
each process group on the links it crosses on the rank grid (``topology``); an MLP by its GEMMs and the terms
a calibrated CPU box measured (below).

Collectives (S bytes, n ranks, per-step latency α, bus bandwidth B; Thakur et al. 2005; nccl-tests PERFORMANCE.md):
    ring all-reduce      2(n−1)·α + 2(n−1)/n · S/B
    tree all-reduce      2·⌈log2 n⌉·α + 2·S/B        (pipelined double binary tree: latency grows with log n)
    all-gather, reduce-scatter   (n−1)·α + (n−1)/n · S/B   (S: the full, gathered size)
    hierarchical all-reduce      reduce-scatter in the node, all-reduce of S/g between nodes, all-gather in the node
Step time = compute + exposed communication + pipeline bubble + optimizer, where the bubble of 1F1B / GPipe is
(pp−1)·(t_f + t_b) per stage, divided by v for interleaved stages (Narayanan et al. 2021, §2.2), and
interleaving multiplies the pipeline messages by v (2·m·v per step: an activation forward and a gradient back
per micro-batch per model chunk).

Terms a calibrated CPU box adds (``Hardware.overheads``, measured by ``calibrate()``; presets have none, so
their factors are 1 and their extra terms 0):
    GEMM by exact shape      a measured (m, k, n) beats the GFLOPs table (grad-weight GEMMs run slower)
    layer factor             autograd ``nn.Linear`` fwd+bwd over the same bare GEMMs (layout, bias, cache)
    AccumulateGrad           3 × grad bytes per parameter per micro-batch (``.grad += new``)
    straggler                a synchronous step runs at the slowest of the ranks side by side
    all-reduce in situ       after compute an all-reduce is slower than in a back-to-back sweep
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cluster_ops import is_attention, moe_host_overhead
from .collectives import (  # noqa: F401
    all_gather,
    all_reduce,
    hierarchical_all_reduce,
    p2p,
    reduce_scatter,
    ring_all_reduce,
    tree_all_reduce,
)
from .compute import accumulate_grad_time, gemm_time, gemms_time  # noqa: F401
from .cpu_share import combine_prediction
from .grad_sync import dp_sync, embedding_sync_time, fsdp_comm, optimizer_time
from .host_ops import GPT_OPS_ENDS, GPT_OPS_PER_LAYER, host_op_time
from .layer import embedding_ops, exposed_comm, head_ops, mtp_ops, op_time, op_time_key, ops_time  # noqa: F401
from .layer_strategy import module_recompute_ops, recompute_ops, strategy_layer_ops
from .memory import activation_bytes_per_layer, check_fits, memory_per_device
from .offload import offload_time
from .overlap import TP_OVERLAP_GEMM_SLOWDOWN, tp_overlap_exposed
from .ring_comm import ring_exposed
from .topology import p2p_time

# ───────────────────────── compute ─────────────────────────


def backward_gemms(model, forward):
    """Each forward GEMM x·W has two backward GEMMs (grad input, grad weight) of the same size; an MLP's first
    layer skips grad input (its input needs no gradient)."""
    out = []
    for i, (m, k, n, c) in enumerate(forward):
        out.append((k, m, n, c))  # grad weight: (k×m)·(m×n)
        if not (model.kind == "mlp" and i == 0):
            out.append((m, n, k, c))  # grad input: (m×n)·(n×k)
    return out


@dataclass
class Prediction:
    """A predicted training step (seconds, bytes); ``breakdown`` has each term that went into it."""

    step_time: float
    compute: float
    exposed_comm: float
    bubble: float
    optimizer: float
    throughput: float | None  # samples per second (None: the plan does not fit in memory)
    tokens_per_s: float | None
    mfu: float | None
    memory: dict
    fits: bool
    breakdown: dict = field(default_factory=dict)

    def as_row(self) -> dict:
        """A flat dict for a table (a plan that does not fit gets NaN throughput: no number, not zero)."""
        row = {
            k: (float("nan") if v is None else v) for k, v in self.__dict__.items() if k not in ("memory", "breakdown")
        }
        row.update({f"mem_{k}": v for k, v in self.memory.items()})
        row.update(self.breakdown)
        return row


def gpt_stage(model, hardware, strategy, processes=1, memo: dict | None = None) -> dict:
    """Seconds of one micro-batch on the slowest pipeline rank of a GPT, from its operators (``layer``).

    A rank holds L/pp layers (in v chunks when interleaved: the same layers in all); the first rank also the
    embedding, the last the logits and the loss — the slower of the two sets the pipeline's pace. Returns
    forward / backward compute (GEMMs + memory-bound kernels; backward includes the recomputed forward) and
    forward_comm / backward_comm (the tensor-parallel collectives, exposed: Megatron does not overlap them).
    ``memo``: operator times shared between calls on one ``hardware`` (the planner's), keyed on what
    :func:`~simlib.sim.layer.op_time` reads (:func:`~simlib.sim.layer.op_time_key`).
    """

    s = strategy
    w = 2 if s.mixed_precision else 4
    compute = ("gemm", "memory", "attention")
    seen: dict = {}  # one operator's time, once per call (the same ops recur in forward, recompute and comm)
    places: dict = {}

    def once(op):
        out = seen.get(op)
        if out is None:
            if memo is None:
                out = op_time(op, hardware, s, processes, s.threads)
            else:
                key = op_time_key(op, hardware, s, processes, s.threads, places)
                out = memo.get(key)
                if out is None:
                    out = memo[key] = op_time(op, hardware, s, processes, s.threads)
            seen[op] = out
        return out

    def t(items, kinds=compute):
        return sum(sum(once(op) for op in items if op.kind == k) for k in kinds)

    def comm(all_items):  # what of a list's collectives compute does not hide (ring hops, TP overlap), by group
        exposed, slow = {}, 0.0
        groups = {op.group for op in all_items if op.kind == "comm"}
        for group in ("tp", "cp", "ep"):
            if group not in groups:  # no collective of this group: nothing exposed, no overlap to price
                exposed[group] = 0.0
                continue
            items = [op for op in all_items if op.kind != "comm" or op.group == group]
            times = [once(op) if op.kind == "comm" or is_attention(op) else 0.0 for op in items]
            exposed[group] = exposed_comm(items, times)
            if group == "cp" and s.cp_kind == "ring":  # simlib's ring on a calibrated CPU: its passes as measured
                exposed[group] = ring_exposed(items, times, hardware, processes) or exposed[group]
            if s.tp_overlap and group == "tp":
                exposed[group], slow = tp_overlap_exposed(items, times, exposed[group], hardware, s, processes)
        return exposed, slow

    def price(expert_layer):
        ops = strategy_layer_ops(model, s, expert_layer, hardware)
        part = recompute_ops(
            ops["forward"], "full" if s.recompute == "every_other" else s.recompute, model
        ) + module_recompute_ops(ops["forward"], s.recompute_modules)
        (fc, fslow), (bc, bslow), (ac, aslow) = comm(ops["forward"]), comm(ops["backward"]), comm(part)
        if s.ep_overlap and expert_layer:  # EP all-to-all overlap (Megatron-Core's overlap_moe_expert_parallel_comm):
            # a forward's dispatch/combine run beside another micro-batch's backward and vice versa, so only what
            # exceeds the layer's forward + backward compute stays exposed (pipeline warm-up/cool-down not apart);
            # the compute beside them slows as the TP overlap's GEMMs do (DeepEP's kernels take SMs: overlap.py)
            a2a = fc["ep"] + bc["ep"]
            hidden = min(a2a, t(ops["forward"]) + t(ops["backward"]))
            left = 1.0 - hidden / a2a if a2a else 1.0
            fc, bc = {**fc, "ep": fc["ep"] * left}, {**bc, "ep": bc["ep"] * left}
            slowdown = hidden * TP_OVERLAP_GEMM_SLOWDOWN
            fslow, bslow = fslow + slowdown / 3, bslow + 2 * slowdown / 3
        host = moe_host_overhead(model, s, hardware) if expert_layer else 0.0  # GPUs: per-expert launches
        fops, bops = (op_host * n for n in GPT_OPS_PER_LAYER)  # a CPU's dispatch per eager op (0 on GPUs)
        fslow, bslow = fslow + host / 3 + fops, bslow + 2 * host / 3 + bops
        again = t(part) + aslow + (fops if s.recompute == "full" else 0.0)
        full = (None, None)  # the whole layer again: read only under every_other and recompute_layers
        if s.recompute == "every_other" or s.recompute_layers:
            whole = recompute_ops(ops["forward"], "full")
            wholec, wholeslow = comm(whole)
            full = (t(whole) + wholeslow + fops, wholec)
        return dict(
            fwd=t(ops["forward"]) + fslow,
            bwd=t(ops["backward"]) + bslow,
            again=again,
            again_full=full[0],
            fcomm=fc,
            bcomm=bc,
            again_comm=ac,
            again_full_comm=full[1],
        )

    op_host = host_op_time(hardware, processes)  # a CPU box: the host's cost per eager op (0 on GPUs)
    kinds = {False: price(False)}
    if model.experts:
        kinds[True] = price(True)
    stages = s.stage_layers(model.layers) if s.virtual_stages == 1 or s.stage_layout else [model.layers / s.pp] * s.pp
    dense_end = model.dense_layers if model.experts else model.layers
    # the logits GEMM stays in 16 bits under FP8 training (Transformer Engine converts the layers' Linears)
    ends_strategy = s.replace(dtype="bf16", fp8_param_gather=False) if s.dtype in ("fp8", "fp4") else s
    vt = s.vocab_tp  # the vocabulary's split: tp (Megatron) or none (simlib's GPT keeps the head whole)
    embed, head = embedding_ops(model, s.micro_batch, vt, w, s.cp), head_ops(model, s.micro_batch, vt, w, s.cp)
    mtp = mtp_ops(model, s.micro_batch, vt, w, s.cp)  # multi-token prediction: on the last stage (Megatron-Core)

    def t_end(items):
        return sum(ops_time(items, hardware, ends_strategy, processes, s.threads, k) for k in compute)

    best, totals = None, []
    for i, n in enumerate(stages):
        start = sum(stages[:i])
        dense = max(0, min(dense_end, start + n) - start)
        counts = {False: dense, True: n - dense} if model.experts else {False: n}
        if i == len(stages) - 1 and model.mtp_layers:  # each MTP module's block (an MoE block with experts)
            counts[bool(model.experts)] += model.mtp_layers
        out = dict(forward=0.0, backward=0.0, forward_comm=0.0, backward_comm=0.0, cp_comm=0.0, ep_comm=0.0)
        left = s.recompute_layers
        for moe, c in counts.items():
            k = kinds[moe]
            if s.recompute == "every_other":  # torchtitan's layer-level AC: every second layer in full
                r, again, again_comm = c / 2, k["again_full"], k["again_full_comm"]
            elif s.recompute_layers:  # Megatron's --recompute-num-layers: the stage's first ones
                r, again, again_comm = min(left, c), k["again_full"], k["again_full_comm"]
                left -= r
            else:
                r, again, again_comm = c, k["again"], k["again_comm"]
            out["forward"] += c * k["fwd"]
            out["backward"] += c * k["bwd"] + r * again
            out["forward_comm"] += c * sum(k["fcomm"].values())
            out["backward_comm"] += c * sum(k["bcomm"].values()) + r * sum(again_comm.values())
            for g in ("cp", "ep"):
                out[f"{g}_comm"] += c * (k["fcomm"][g] + k["bcomm"][g]) + r * again_comm[g]
        layers_here = max(n, 1)
        out["layer_forward"] = out["forward"] / layers_here
        out["layer_backward"] = out["backward"] / layers_here
        ends = ([embed] if i == 0 else []) + ([head, mtp] if i == len(stages) - 1 else [])
        for e in ends:
            out["forward"] += t_end(e["forward"])
            out["backward"] += t_end(e["backward"])
        if i == len(stages) - 1:  # the ends' eager ops, counted on the last stage (the head and loss: most)
            out["forward"] += op_host * GPT_OPS_ENDS[0]
            out["backward"] += op_host * GPT_OPS_ENDS[1]
        out["forward"], out["backward"] = (out[k] * hardware.straggler(processes) for k in ("forward", "backward"))
        total = out["forward"] + out["backward"] + out["forward_comm"] + out["backward_comm"]
        totals.append(total)
        if best is None or total > best[0]:
            best = (total, out)
    # per micro-batch, the slowest stage beyond the mean one: the lighter stages idle that long (cpu_share.py)
    return {**best[1], "stage_excess": best[0] - sum(totals) / len(totals)}


def stage_times(model, hardware, strategy, processes=1):
    """(forward, backward) seconds of one micro-batch on one pipeline stage of one device.

    GPT: the operator model (:func:`gpt_stage`, tensor-parallel collectives included). MLP: its GEMMs, the
    element-wise bytes and the calibrated CPU terms."""
    s = strategy
    if model.kind == "gpt":
        st = gpt_stage(model, hardware, s, processes)
        return st["forward"] + st["forward_comm"], st["backward"] + st["backward_comm"]
    fwd = model.forward_gemms(s.micro_batch, s.tp, layers=model.layers)
    layer = hardware.layer_factor(processes, s.threads)  # autograd layers vs bare GEMMs (calibrated CPU box; else 1)
    t_fwd = layer * gemms_time(fwd, hardware, s.dtype, processes, s.threads) / s.pp  # even split over stages
    t_bwd = layer * gemms_time(backward_gemms(model, fwd), hardware, s.dtype, processes, s.threads) / s.pp
    elementwise = elementwise_bytes(model, s) / hardware.mem_rate(processes) / s.pp
    t_fwd += 2 / 5 * elementwise  # forward: write each activation, read it once (ReLU: read + write)
    t_bwd += 3 / 5 * elementwise  # backward: read grad, read the saved activation, write
    t_bwd += accumulate_grad_time(model.params / (s.tp * s.pp), hardware, s, processes)
    if s.recompute == "full":
        t_bwd += t_fwd
    elif s.recompute == "selective" and model.kind == "gpt":  # recompute the attention score GEMMs only
        t_bwd += sum(c * gemm_time(m, k, n, hardware, s.dtype) for m, k, n, c in fwd[1:3]) / s.pp
    straggle = hardware.straggler(processes)  # a synchronous step runs at its slowest rank's pace
    return t_fwd * straggle, t_bwd * straggle


def elementwise_bytes(model, strategy) -> float:
    """Bytes moved by element-wise work per micro-batch on one device (memory-bound, not GEMMs).

    MLP: ReLU forward (read + write) and backward (3 passes), fp32. GPT: an assumption — every activation that
    Korthikanti et al. count as stored (layer norms, softmax, dropout, GeLU) is written and read about five
    times over forward and backward; this is the term that keeps a GPT layer below its GEMMs' speed.
    """
    s = strategy
    if model.kind == "mlp":
        return model.elementwise_bytes(s.micro_batch)
    per_layer = activation_bytes_per_layer(model, s.micro_batch, s.tp, "none", s.sequence_parallel)
    return 5.0 * per_layer * model.layers


def predict(model, hardware, strategy, processes: int | None = None, require_fit: bool = False) -> Prediction:
    """Predict one optimizer step of ``model`` split by ``strategy`` on ``hardware``.

    step = compute + exposed communication + bubble + optimizer, where (per micro-batch, slowest pipeline rank)
    compute is the operators' time (``layer``: GEMMs and memory-bound kernels, recomputation included), the
    exposed communication is the tensor-parallel collectives, 2·v pipeline messages (forward activation and
    backward gradient per model chunk), and the data-parallel sync (overlapped with the last backward when
    ``overlap``), and the 1F1B bubble is (pp − 1)/v stage times. A plan that does not fit in memory reports
    no throughput (``throughput``, ``tokens_per_s``, ``mfu`` are None): it would not run.

    ``processes``: processes sharing one node's cores (CPU box; default: the world size, capped at one node).
    """
    s = strategy.validate(model=model, hardware=hardware)
    processes = processes or min(s.world_size, hardware.devices_per_node)
    m, v = s.num_micro_batches, s.virtual_stages
    act_bytes = s.micro_batch * model.seq_len // s.cp * model.hidden * (2 if s.mixed_precision else 4)
    if model.kind == "gpt":
        st = gpt_stage(model, hardware, s, processes)
        t_fwd, t_bwd = st["forward"], st["backward"]
        tp_per_mb = st["forward_comm"] + st["backward_comm"]
    else:
        t_fwd, t_bwd = stage_times(model, hardware, s, processes)
        tp_per_mb = 4 * ring_all_reduce(act_bytes, s.tp, hardware.intra) * model.layers / s.pp if s.tp > 1 else 0
    compute = m * (t_fwd + t_bwd)
    tp_comm = m * tp_per_mb
    stage_idle = m * st["stage_excess"] if model.kind == "gpt" else 0.0  # lighter stages beside the slowest
    cluster = {}  # of tp_comm: what the context- and expert-parallel collectives take (exposed)
    if model.kind == "gpt" and (s.cp > 1 or s.ep > 1):
        cluster = dict(cp_comm=m * st["cp_comm"], ep_comm=m * st["ep_comm"])
        tp_comm -= cluster["cp_comm"] + cluster["ep_comm"]
    bubble = s.pipeline_flushes * (s.pp - 1) * (t_fwd + t_bwd + tp_per_mb) / v if s.pp > 1 else 0.0
    pp_messages = 2 * m * v if s.pp > 1 else 0
    pp_comm = pp_messages * p2p_time(act_bytes, s, hardware)
    if s.fsdp and model.kind == "gpt":
        f = fsdp_comm(model, hardware, s, st["layer_forward"], st["layer_backward"])
        dp_total, dp_exposed = f["step_total"], f["step_exposed"]
    else:
        sync = dp_sync(model, hardware, s, processes)  # bucket by bucket under backward (and forward)
        dp_total, dp_exposed = sync.total, sync.exposed(t_fwd, t_bwd, s.overlap)
    embed = embedding_sync_time(model, hardware, s)
    offload = m * offload_time(model, hardware, s, st) if model.kind == "gpt" else 0.0  # host copies not hidden
    exposed = tp_comm + sum(cluster.values()) + pp_comm + dp_exposed + embed + offload
    opt = optimizer_time(model, hardware, s, processes)
    step = compute + bubble + exposed + opt
    mem = memory_per_device(model, s)
    fits = mem["total"] <= 0.9 * hardware.memory_bytes
    if require_fit:
        check_fits(model, s, hardware)
    samples = s.global_batch
    model_flops = model.flops_per_sample() * samples
    mfu = model_flops / (step * s.world_size * hardware.peak(s.dtype, processes))
    throughput, tokens = samples / step, samples * model.seq_len / step
    if not fits:
        throughput = tokens = mfu = None
    out = Prediction(
        step,
        compute,
        exposed,
        bubble,
        opt,
        throughput,
        tokens,
        mfu,
        mem,
        fits,
        dict(
            forward=t_fwd * m,
            backward=t_bwd * m,
            tp_comm=tp_comm,
            pp_comm=pp_comm,
            pp_messages=pp_messages,
            dp_comm=dp_total,
            dp_exposed=dp_exposed,
            embedding_sync=embed,
            offload=offload,
            stage_idle=stage_idle,
            **cluster,
        ),
    )
    own = hardware.own_cores(processes)  # ranks sharing a CPU's cores: processor sharing (sim/cpu_share.py)
    return combine_prediction(out, predict(model, hardware, s, own)) if own else out


def scaling(model, hardware, strategies, processes=None):
    """A table of predictions, one row per strategy, with speedup and efficiency against the first row."""
    import pandas as pd

    rows = []
    for s in strategies:
        p = predict(model, hardware, s, processes)
        rows.append(dict(world_size=s.world_size, dp=s.dp, tp=s.tp, pp=s.pp, global_batch=s.global_batch, **p.as_row()))
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    per_device = table["throughput"] / table["world_size"]
    table["speedup"] = table["throughput"] / base["throughput"]
    table["efficiency"] = per_device / (base["throughput"] / base["world_size"])
    table["comm_fraction"] = table["exposed_comm"] / table["step_time"]
    return table
