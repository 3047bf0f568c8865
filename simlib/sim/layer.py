"""A transformer layer operator by operator: GEMMs, memory-bound kernels and tensor-parallel collectives.

Each operator is priced on its own, so a learner can see where a layer's time goes:

- a **GEMM** has its math (FLOPs at the efficiency the hardware reaches for a GEMM of that many FLOPs,
  Calculon's table) and its own memory traffic (reading both inputs, writing the output, at the achievable
  bandwidth). ``Hardware.processing`` says how they combine: "roofline" takes the longer, "no_overlap" their
  sum (what Calculon's A100/H100 files use, and the GPU presets here). The attention GEMMs (head dimension
  64–160) are dominated by memory: they write or read an s × s matrix per head.
- a **memory-bound kernel** (layer norm, softmax, dropout, GeLU, residual add) moves its bytes at the achievable
  memory bandwidth for a kernel of that size (Calculon's table); its FLOPs are negligible.
- a **collective** (Megatron's f/g all-reduces, or the reduce-scatter + all-gather pairs of sequence
  parallelism) is priced on the tensor-parallel group's placement (``topology``).

Kernels are fused as Megatron-LM ran them for Narayanan et al. 2021 (fused scale-mask-softmax, fused bias+GeLU,
fused bias+dropout+residual-add; attention dropout a separate kernel; bias of QKV inside its GEMM). Byte counts
are per element: 2 for an fp16/bf16 tensor, 1 for a dropout mask.

    ops = layer_ops(gpt, micro_batch=2, tp=8)                 # {"forward": [...], "backward": [...]}
    operator_table(gpt, sim.dgx_a100(), strategy)             # one row per operator, with its time
"""
from __future__ import annotations

from dataclasses import dataclass

from .compute import gemm_time
from .topology import group_collective, placement


@dataclass(frozen=True)
class Op:
    """One operator of a layer on one tensor-parallel rank: a GEMM ``(m, k, n)`` repeated ``count`` times, a
    memory-bound kernel moving ``bytes``, or a collective of ``bytes`` (``collective``: all_reduce, ...)."""

    name: str
    kind: str                 # "gemm" | "memory" | "comm"
    bytes: float              # memory traffic (gemm, memory) or message size (comm), all counts together
    shape: tuple = ()         # gemm: (m, k, n)
    count: int = 1            # gemm: how many such GEMMs (batched attention: micro_batch × heads per rank)
    collective: str = ""      # comm: all_reduce | reduce_scatter | all_gather

    @property
    def flops(self) -> float:
        if self.kind != "gemm":
            return 0.0
        m, k, n = self.shape
        return 2.0 * m * k * n * self.count


def _gemm(name, m, k, n, count=1, width=2):
    """A GEMM (m×k)·(k×n), ``count`` of them: reads both inputs, writes the output."""
    return Op(name, "gemm", width * (m * k + k * n + m * n) * count, (m, k, n), count)


def _backward_gemms(op: Op, skip_dgrad: bool = False):
    """Each forward GEMM x·W has a data-gradient GEMM (m×n)·(n×k) and a weight-gradient GEMM (k×m)·(m×n)."""
    m, k, n = op.shape
    out = [] if skip_dgrad else [_gemm(f"{op.name} dgrad", m, n, k, op.count)]
    return out + [_gemm(f"{op.name} wgrad", k, m, n, op.count)]


def layer_ops(model, micro_batch: int, tp: int = 1, sequence_parallel: bool = False, width: int = 2) -> dict:
    """Forward and backward operators of one GPT layer for one micro-batch on one tensor-parallel rank.

    ``width``: bytes per activation element (2 for fp16/bf16). With sequence parallelism the layer norms and
    dropouts work on s/tp of the sequence and each all-reduce becomes a reduce-scatter + all-gather pair.
    """
    if model.kind != "gpt":
        raise ValueError("layer_ops describes a GPT layer; an MLP is priced by its GEMMs (cost.stage_times)")
    b, s, h, a = micro_batch, model.seq_len, model.hidden, model.heads
    t, d, heads = b * s, h // a, a // tp           # tokens, head dimension, heads on this rank
    w = width
    th, th_tp = t * h, t * h / tp                  # a full activation, and its tensor-parallel share
    local = th / tp if sequence_parallel else th   # layer norm / dropout / residual: sequence-sharded or whole
    ss = b * heads * s * s                         # attention score elements on this rank

    def collective(name, kind):
        return [Op(name, "comm", w * th, collective=kind)] if tp > 1 else []

    # Megatron's conjugate operators (Shoeybi et al. 2019; with sequence parallelism Korthikanti et al. 2022):
    # f before a column-parallel GEMM: identity forward, all-reduce backward (SP: all-gather / reduce-scatter);
    # g after a row-parallel GEMM: all-reduce forward, identity backward (SP: reduce-scatter / all-gather).
    # With SP the input of a column-parallel GEMM is kept sequence-sharded, so backward all-gathers it again for
    # the weight gradient (Korthikanti et al. 2022 §4.2.2) before f's reduce-scatter.
    if sequence_parallel:
        f_fwd = collective("f all-gather", "all_gather")
        f_bwd = collective("input all-gather again (for wgrad)", "all_gather") + \
            collective("f backward reduce-scatter", "reduce_scatter")
        g_fwd = collective("g reduce-scatter", "reduce_scatter")
        g_bwd = collective("g backward all-gather", "all_gather")
    else:
        f_fwd, f_bwd = [], collective("f backward all-reduce", "all_reduce")
        g_fwd, g_bwd = collective("g all-reduce", "all_reduce"), []

    qkv = _gemm("QKV", t, h, 3 * h // tp)
    scores = _gemm("scores Q·Kᵀ", s, d, s, b * heads)
    context = _gemm("context P·V", s, s, d, b * heads)
    proj = _gemm("attention out", t, h // tp, h)
    up = _gemm("MLP up", t, h, 4 * h // tp)
    down = _gemm("MLP down", t, 4 * h // tp, h)
    forward = [
        Op("layer norm 1", "memory", 2 * w * local), *f_fwd, qkv, scores,
        Op("scale+mask+softmax (fused)", "memory", 2 * w * ss),
        Op("attention dropout", "memory", (2 * w + 1) * ss), context,
        Op("context permute", "memory", 2 * w * th_tp), proj, *g_fwd,
        Op("bias+dropout+add (fused)", "memory", (3 * w + 1) * local),
        Op("layer norm 2", "memory", 2 * w * local), *f_fwd, up,
        Op("bias+GeLU (fused)", "memory", 2 * w * 4 * th_tp), down, *g_fwd,
        Op("bias+dropout+add (fused)", "memory", (3 * w + 1) * local),
    ]
    backward = [  # reverse order; a backward kernel reads the saved input and the incoming grad, writes a grad
        Op("bias+dropout+add backward", "memory", (3 * w + 1) * local), *g_bwd, *_backward_gemms(down),
        Op("bias+GeLU backward (+ bias grad)", "memory", 4 * w * 4 * th_tp), *_backward_gemms(up), *f_bwd,
        Op("layer norm 2 backward (+ residual grad)", "memory", 8 * w * local),
        Op("bias+dropout+add backward", "memory", (3 * w + 1) * local), *g_bwd, *_backward_gemms(proj),
        Op("context permute backward", "memory", 2 * w * th_tp), *_backward_gemms(context),
        Op("attention dropout backward", "memory", (2 * w + 1) * ss),
        Op("softmax backward", "memory", 3 * w * ss), *_backward_gemms(scores),
        Op("Q,K,V grads gathered (+ bias grad)", "memory", 3 * w * 3 * th_tp), *_backward_gemms(qkv), *f_bwd,
        Op("layer norm 1 backward (+ residual grad)", "memory", 8 * w * local),
    ]
    return dict(forward=forward, backward=backward)


def head_ops(model, micro_batch: int, tp: int = 1, width: int = 2) -> dict:
    """The last stage's logits GEMM (vocabulary split over tp) and the vocab-parallel cross-entropy.

    Cross-entropy works in fp32 on t × V/tp logits: forward ≈ 38 bytes per logit (cast to fp32, max, subtract,
    exp, sum, divide), backward ≈ 22 (subtract the one-hot, scale, cast back) — counted from Megatron-LM's
    ``vocab_parallel_cross_entropy``; an approximation of its kernels."""
    if not model.vocab:
        return dict(forward=[], backward=[])
    t, h = micro_batch * model.seq_len, model.hidden
    logits = _gemm("logits", t, h, model.vocab // tp)
    n = t * model.vocab / tp
    return dict(forward=[logits, Op("cross-entropy (fp32)", "memory", 38.0 * n)],
                backward=[Op("cross-entropy backward", "memory", 22.0 * n), *_backward_gemms(logits)])


def embedding_ops(model, micro_batch: int, tp: int = 1, width: int = 2) -> dict:
    """The first stage's embedding lookup + dropout, and its gradient (a dense V/tp × h table, zeroed and
    accumulated each micro-batch)."""
    t, h = micro_batch * model.seq_len, model.hidden
    table = width * (model.vocab // tp) * h if model.vocab else 0.0
    return dict(forward=[Op("embedding lookup + dropout", "memory", (4 * width + 1) * t * h)],
                backward=[Op("embedding grad", "memory", (2 * width + 1) * t * h + 2 * table)])


def gemm_parts(op: Op, hardware, strategy=None, processes: int = 1, threads=None):
    """(math, memory) seconds of a GEMM: its FLOPs at the GEMM efficiency for its size, and its own bytes at
    the achievable bandwidth for one GEMM of the batch."""
    m, k, n = op.shape
    dtype = strategy.dtype if strategy is not None else "bf16"
    if hardware.peak_flops:   # a GPU: the whole batched call sets the efficiency
        math = op.flops / hardware.gemm_rate(op.flops / 1e9, dtype)
    else:                     # a calibrated CPU box: its measured table per GEMM
        math = op.count * gemm_time(m, k, n, hardware, dtype, processes, threads)
    return math, op.bytes / hardware.achievable_bandwidth(op.bytes / op.count, processes)


def op_time(op: Op, hardware, strategy=None, processes: int = 1, threads=None) -> float:
    """Seconds of one operator: a GEMM's roofline, a kernel's bytes at achievable bandwidth, a collective on
    the tensor-parallel group's placement."""
    if op.kind == "gemm":
        math, memory = gemm_parts(op, hardware, strategy, processes, threads)
        return math + memory if hardware.processing == "no_overlap" else max(math, memory)
    if op.kind == "memory":
        return op.bytes / hardware.achievable_bandwidth(op.bytes, processes)
    if strategy is None:
        raise ValueError("a collective needs the strategy (its group's placement)")
    return group_collective(op.collective, op.bytes, placement(strategy, hardware, "tp"), hardware)


def ops_time(ops, hardware, strategy=None, processes=1, threads=None, kind=None) -> float:
    return sum(op_time(op, hardware, strategy, processes, threads) for op in ops if kind in (None, op.kind))


def recompute_ops(forward, recompute: str):
    """What backward re-runs: full — the whole forward of the layer (its collectives too); selective — the
    attention core only (scores, softmax, dropout, context: Korthikanti et al. 2022 §5); none — nothing."""
    if recompute == "full":
        return [Op(f"recompute {op.name}", op.kind, op.bytes, op.shape, op.count, op.collective) for op in forward]
    if recompute == "selective":
        core = ("scores", "scale+mask", "attention dropout", "context P")
        return [Op(f"recompute {op.name}", op.kind, op.bytes, op.shape, op.count, op.collective)
                for op in forward if op.name.startswith(core)]
    return []


def operator_table(model, hardware, strategy, processes: int = 1):
    """One row per operator of one layer (forward, recomputation, backward) for one micro-batch: kind,
    GFLOPs, MB moved, milliseconds, achieved TFLOP/s and which limit binds (math, memory, link)."""
    import pandas as pd

    s = strategy
    width = 2 if s.mixed_precision else 4
    ops = layer_ops(model, s.micro_batch, s.tp, s.sequence_parallel, width)
    rows = []
    for phase, items in (("forward", ops["forward"]), ("recompute", recompute_ops(ops["forward"], s.recompute)),
                         ("backward", ops["backward"])):
        for op in items:
            t = op_time(op, hardware, s, processes, s.threads)
            bound = ""
            if op.kind == "gemm":  # whichever of the GEMM's math and its own memory traffic takes longer
                math, memory = gemm_parts(op, hardware, s, processes, s.threads)
                bound = "math" if math >= memory else "memory"
            rows.append(dict(phase=phase, op=op.name, kind=op.kind, gflops=op.flops / 1e9, mb=op.bytes / 1e6,
                             ms=t * 1e3, tflops=op.flops / t / 1e12 if t and op.flops else 0.0,
                             bound=bound or {"memory": "memory", "comm": "link"}[op.kind]))
    return pd.DataFrame(rows)
