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

from .attention import mean_pairs, mla_gemms
from .cluster_ops import cp_ops, exposed_comm, moe_ops  # noqa: F401 - exposed_comm: used by cost
from .compute import gemm_time
from .gemm_shape import gemm_shape_rate
from .ops import Op, _backward_gemms, _gemm, fp8_cast_bytes  # noqa: F401 - Op is this module's vocabulary
from .presets import MXFP8_GEMM_RATIO
from .ring_comm import in_situ_all_reduce
from .strategy import ATTENTION
from .topology import group_collective, placement, remote_copy_share


def layer_ops(
    model,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    width: int = 2,
    attention: str = "unfused",
    fp8: bool = False,
    kernels: str = "fused",
    cp: int = 1,
    cp_kind: str = "allgather",
    ep: int = 1,
    expert_layer: bool = False,
    imbalance: float = 1.0,
    fp8_transpose: bool = True,
) -> dict:
    """Forward and backward operators of one GPT layer for one micro-batch on one tensor-parallel rank.

    ``width``: bytes per activation element (2 for fp16/bf16). With sequence parallelism the layer norms and
    dropouts work on s/tp of the sequence and each all-reduce becomes a reduce-scatter + all-gather pair.

    ``attention="unfused"`` prices attention as Megatron-LM ran it in 2021: two batched GEMMs around a fused
    scale-mask-softmax and a dropout, each moving the b·a·s² score matrix through memory. ``"flash"`` is one
    fused kernel (FlashAttention, Dao et al. 2022/2023) that never writes the score matrix: its FLOPs (causal: half
    of 4·b·a·s²·d forward, 2.5× that backward, Dao 2023 §4) run at the fraction of peak that kernel reaches on the
    machine (``Hardware.attention_efficiency``; ``"flash1"``: FlashAttention-1 or the Triton kernel of that
    generation, slower; ``"cudnn"``: cuDNN's fused attention, Transformer Engine's choice on Hopper and later). The
    model's shape decides the rest: grouped-query K/V
    (``model.kv``), the MLP width and gate (SwiGLU's element-wise silu·up), RMSNorm or LayerNorm, rotary
    embeddings applied to Q and K, and dropout only where the model has it. ``fp8``: Transformer Engine-style
    FP8 GEMMs, whose inputs are cast to FP8 (and transposed for the weight gradient) by memory-bound kernels
    (:func:`~simlib.sim.ops.fp8_cast_bytes`; ``fp8_transpose=False``: no transposed copy, as on Blackwell).

    ``kernels="eager"``: the element-wise parts run as separate PyTorch ops, as torchtitan's Llama does without
    torch.compile (``models/norms.py``, ``models/llama/model.py``), each op reading and writing its tensor:
    RMSNorm through fp32 (``x.float()``, ``pow``, ``mean``, ``x·rsqrt``, ``type_as``, ``·weight``: ≈36 bytes per
    element forward, ≈60 backward, where a fused kernel moves 4 and 16), rotary embeddings through complex fp32
    (≈20 bytes per element each way), SwiGLU as ``silu`` then ``·`` (10 forward, 18 backward), grouped-query K and V
    repeated to all heads before attention, and the attention output transposed back to contiguous.

    Attention variants (:mod:`simlib.sim.attention`): multi-head latent attention replaces the QKV GEMM by its
    down projections, two latent RMSNorms and up projections, and the kernel runs over query/key and value
    dimensions of their own (``model.attention_dim``); a sliding window on some layers shrinks the fused kernel's
    work to the pairs it sees (averaged over the layers; unfused attention still computes the whole s × s and
    masks it).

    ``cp`` > 1: the layer works on s/cp tokens of each sequence, its attention on s/cp queries against all s keys
    (causal, zig-zag balanced), with the context-parallel collectives of ``cp_kind`` (:func:`cluster_ops.cp_ops`).
    ``expert_layer``: the MLP is the model's mixture of experts on ``ep`` ranks (:func:`cluster_ops.moe_ops`).
    """
    if model.kind != "gpt":
        raise ValueError("layer_ops describes a GPT layer; an MLP is priced by its GEMMs (cost.stage_times)")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be 'unfused', 'flash', 'flash1' or 'cudnn', got {attention!r}")
    b, s, h, a = micro_batch, model.seq_len, model.hidden, model.heads
    sq = s // cp  # queries (and tokens) of each sequence on this rank
    t, d, heads = b * sq, model.head_dim, a // tp  # tokens, head dimension, heads on this rank
    w = width
    th, th_tp = t * h, t * h / tp  # a full activation, and its tensor-parallel share
    local = th / tp if sequence_parallel else th  # layer norm / dropout / residual: sequence-sharded or whole
    ss = b * heads * sq * s  # attention score elements on this rank
    mask = 1 if model.dropout else 0  # a dropout keeps a 1-byte mask per element
    f_tp = t * model.ffn / tp  # MLP inner activation elements on this rank
    qkv_tp = t * model.qkv_width / tp

    def collective(name, kind):
        return [Op(name, "comm", w * th, collective=kind)] if tp > 1 else []

    # Megatron's conjugate operators (Shoeybi et al. 2019; with sequence parallelism Korthikanti et al. 2022):
    # f before a column-parallel GEMM: identity forward, all-reduce backward (SP: all-gather / reduce-scatter);
    # g after a row-parallel GEMM: all-reduce forward, identity backward (SP: reduce-scatter / all-gather).
    # With SP the input of a column-parallel GEMM is kept sequence-sharded, so backward all-gathers it again for
    # the weight gradient (Korthikanti et al. 2022 §4.2.2) before f's reduce-scatter.
    if sequence_parallel:
        f_fwd = collective("f all-gather", "all_gather")
        f_bwd = collective("input all-gather again (for wgrad)", "all_gather") + collective(
            "f backward reduce-scatter", "reduce_scatter"
        )
        g_fwd = collective("g reduce-scatter", "reduce_scatter")
        g_bwd = collective("g backward all-gather", "all_gather")
    else:
        f_fwd, f_bwd = [], collective("f backward all-reduce", "all_reduce")
        g_fwd, g_bwd = collective("g all-reduce", "all_reduce"), []

    if model.mla:  # latent down projections (whole on every tp rank), their RMSNorms, up projections
        qkv_gemms = [_gemm(name, m, k, n) for name, m, k, n in mla_gemms(model, t, tp)]
        latent = t * (model.q_lora + model.kv_lora)
        latent_norms = [Op("MLA latent RMSNorms", "memory", 2 * w * latent)]
        latent_norms_bwd = [Op("MLA latent RMSNorms backward", "memory", 4 * w * latent)]
    else:
        qkv_gemms, latent_norms, latent_norms_bwd = [_gemm("QKV", t, h, model.qkv_width // tp)], [], []
    proj = _gemm("attention out", t, model.q_width // tp, h)
    up = _gemm("MLP up" + (" + gate" if model.gated_mlp else ""), t, h, model.up_width // tp)
    down = _gemm("MLP down", t, model.ffn // tp, h)
    norm = "RMSNorm" if model.norm == "rmsnorm" else "layer norm"
    add = "bias+dropout+add (fused)" if model.dropout else "residual add"
    add_bwd = "bias+dropout+add backward" if model.dropout else "residual grad add"
    if model.gated_mlp:  # SwiGLU: read gate and up, write silu(gate)·up; backward reads both and the grad
        act = Op("SwiGLU silu·up", "memory", 3 * w * f_tp)
        act_bwd = Op("SwiGLU backward", "memory", 5 * w * f_tp)
    else:
        act = Op("bias+GeLU (fused)", "memory", 2 * w * f_tp)
        act_bwd = Op("bias+GeLU backward (+ bias grad)", "memory", 4 * w * f_tp)
    # rotary on Q and K (MLA: only the rope part of each head's query and the one shared rotary key)
    # (the query's width is heads × head_dim, which is not the hidden size in Qwen3 or GPT-OSS). YaRN with a
    # concentration factor (``model.rope_mscale`` ≠ 1: GPT-OSS) is applied unfused by Megatron-Core: TE's fused RoPE
    # takes no scale (``rope_utils.apply_rotary_pos_emb`` warns and falls back, Megatron-LM cba6b0ed / b0cc2706), so
    # ``t·cos + rotate_half(t)·sin`` runs op by op: forward 12·w bytes per element (two products, the rotation's
    # negation and cat, the sum, a final cat with the empty pass-through part), backward 14·w (the products'
    # gradients, the rotation's, two accumulations and the empty part's zero gradient), as PyTorch dispatches them
    # (tests/test_sim_moe_eager.py); and per call (Q, K) the fp32 cos and sin tables of sq × d, each computed,
    # scaled and cast (20 + w bytes an entry), read again in 16 bits by the products forward and backward
    rope_w = (a * model.qk_rope / tp + model.qk_rope) if model.mla else (a * d + model.kv * d) / tp
    rope_fwd, rope_bwd_b, tag = 2 * w * t * rope_w, 2 * w * t * rope_w, ""
    if model.rope_mscale != 1.0 and not model.mla:
        tables = 2 * 2 * sq * d  # two calls, cos and sin
        rope_fwd, rope_bwd_b = 12 * w * t * rope_w + (20 + 2 * w) * tables, 14 * w * t * rope_w + w * tables
        tag = " (unfused: YaRN scale)"
    rope = [Op("rotary embedding on Q, K" + tag, "memory", rope_fwd)] if model.position == "rope" else []
    rope_bwd = [Op("rotary embedding backward" + tag, "memory", rope_bwd_b)] if rope else []
    if attention != "unfused":  # sliding windows (attention.mean_pairs) make the kernel's work smaller
        pairs, da = mean_pairs(model, s, cp), model.attention_dim
        core_fwd = [*rope, Op(f"{attention} attention", "attention", 0.0, (sq, da, s), b * heads, pairs=pairs)]
        core_bwd = [
            Op(f"{attention} attention backward", "attention", 0.0, (sq, da, s), b * heads, pairs=pairs),
            *rope_bwd,
        ]
    else:
        scores = _gemm("scores Q·Kᵀ", sq, d, s, b * heads)
        context = _gemm("context P·V", sq, s, d, b * heads)
        core_fwd = [
            *rope,
            scores,
            Op("scale+mask+softmax (fused)", "memory", 2 * w * ss),
            *([Op("attention dropout", "memory", (2 * w + 1) * ss)] if model.dropout else []),
            context,
            Op("context permute", "memory", 2 * w * th_tp),
        ]
        core_bwd = [
            Op("context permute backward", "memory", 2 * w * th_tp),
            *_backward_gemms(context),
            *([Op("attention dropout backward", "memory", (2 * w + 1) * ss)] if model.dropout else []),
            Op("softmax backward", "memory", 3 * w * ss),
            *_backward_gemms(scores),
            *rope_bwd,
        ]

    # FP8 casts (ops.fp8_cast_bytes): read w bytes, write 1 and its transpose (1 more); "current" scaling reads the
    # tensor once more for its amax, "blockwise" re-reads for the transposed copy's scales, "mx" writes two scaled copies
    per_element = fp8_cast_bytes(fp8, w, fp8_transpose)

    def cast(name, gemm):  # FP8: cast the GEMM's activation input to FP8 (read 2, write 1 byte) and transpose it
        m, k, _ = gemm.shape
        return [Op(f"{name} FP8 cast + transpose", "memory", per_element * m * k)] if fp8 else []

    def cast_bwd(name, gemm):  # FP8 backward: cast and transpose the incoming gradient
        m, _, n = gemm.shape
        return [Op(f"{name} grad FP8 cast + transpose", "memory", per_element * m * n)] if fp8 else []

    eager_fwd, eager_bwd = [], []
    if kernels == "eager":  # the extra traffic of running the element-wise parts op by op (see docstring)
        qk = t * (a * d + model.kv * d) / tp
        pairs = [(f"{norm}s op by op (fp32)", 2 * (36 - 2 * w) * local, 2 * (60 - 8 * w) * local)]
        if rope:
            pairs.append(("rotary op by op (complex fp32)", (20 - 2 * w) * qk, (20 - 2 * w) * qk))
        if model.gated_mlp:
            pairs.append(("silu, then multiply", (10 - 3 * w) * f_tp, (18 - 5 * w) * f_tp))
        if model.kv != model.heads:
            repeat = 2 * w * (t * model.kv * d / tp + th_tp)
            pairs.append(("K, V repeated to all heads", repeat, repeat))
        pairs.append(("attention output made contiguous", 2 * w * th_tp, 2 * w * th_tp))
        eager_fwd = [Op(name, "memory", fwd) for name, fwd, _ in pairs]
        eager_bwd = [Op(f"{name} backward", "memory", bwd) for name, _, bwd in pairs]
    qkv_fwd = [op for g in qkv_gemms for op in (*cast(g.name, g), g)]
    qkv_fwd[len(qkv_fwd) // 2 : len(qkv_fwd) // 2] = latent_norms  # MLA: after the down projections
    qkv_bwd = [op for g in reversed(qkv_gemms) for op in (*cast_bwd(g.name, g), *_backward_gemms(g))]
    qkv_bwd[len(qkv_bwd) // 2 : len(qkv_bwd) // 2] = latent_norms_bwd
    context_par = cp_ops(model, b, tp, cp, cp_kind, w)
    core_fwd = [*context_par["forward"], *core_fwd]
    core_bwd = [*core_bwd, *context_par["backward"]]
    if expert_layer:  # the mixture of experts replaces the MLP (its own collectives, tp's for shared experts)
        experts = moe_ops(model, t, tp, ep, w, imbalance, sequence_parallel, fp8, fp8_transpose)
        mlp_fwd, mlp_bwd = experts["forward"], experts["backward"]
    else:
        mlp_fwd = [*f_fwd, *cast("MLP up", up), up, act, *cast("MLP down", down), down, *g_fwd]
        mlp_bwd = [
            *g_bwd,
            *cast_bwd("MLP down", down),
            *_backward_gemms(down),
            act_bwd,
            *cast_bwd("MLP up", up),
            *_backward_gemms(up),
            *f_bwd,
        ]
    forward = [
        *eager_fwd,
        Op(f"{norm} 1", "memory", 2 * w * local),
        *f_fwd,
        *qkv_fwd,
        *core_fwd,
        *cast("attention out", proj),
        proj,
        *g_fwd,
        Op(add, "memory", (3 * w + mask) * local),
        Op(f"{norm} 2", "memory", 2 * w * local),
        *mlp_fwd,
        Op(add, "memory", (3 * w + mask) * local),
    ]
    backward = [  # reverse order; a backward kernel reads the saved input and the incoming grad, writes a grad
        Op(add_bwd, "memory", (3 * w + mask) * local),
        *mlp_bwd,
        Op(f"{norm} 2 backward (+ residual grad)", "memory", 8 * w * local),
        Op(add_bwd, "memory", (3 * w + mask) * local),
        *g_bwd,
        *cast_bwd("attention out", proj),
        *_backward_gemms(proj),
        *core_bwd,
        Op("Q,K,V grads gathered (+ bias grad)", "memory", 3 * w * qkv_tp),
        *qkv_bwd,
        *f_bwd,
        Op(f"{norm} 1 backward (+ residual grad)", "memory", 8 * w * local),
        *eager_bwd,
    ]
    return dict(forward=forward, backward=backward)


def head_ops(model, micro_batch: int, tp: int = 1, width: int = 2, cp: int = 1) -> dict:
    """The last stage's logits GEMM (vocabulary split over tp) and the vocab-parallel cross-entropy.

    Cross-entropy works in fp32 on t × V/tp logits: forward ≈ 38 bytes per logit (cast to fp32, max, subtract,
    exp, sum, divide), backward ≈ 22 (subtract the one-hot, scale, cast back) — counted from Megatron-LM's
    ``vocab_parallel_cross_entropy``; an approximation of its kernels."""
    if not model.vocab:
        return dict(forward=[], backward=[])
    t, h = micro_batch * model.seq_len // cp, model.hidden
    logits = _gemm("logits", t, h, model.vocab // tp)
    n = t * model.vocab / tp
    return dict(
        forward=[logits, Op("cross-entropy (fp32)", "memory", 38.0 * n)],
        backward=[Op("cross-entropy backward", "memory", 22.0 * n), *_backward_gemms(logits)],
    )


def mtp_ops(model, micro_batch: int, tp: int = 1, width: int = 2, cp: int = 1) -> dict:
    """What each multi-token-prediction module adds on the last stage besides its transformer block
    (:mod:`simlib.sim.attention`; DeepSeek-V3 report §2.2): the next tokens' embedding lookup, the two RMSNorms,
    the projection M (2h → h, column-parallel) and the shared head's logits and cross-entropy once more."""
    if not model.mtp_layers:
        return dict(forward=[], backward=[])
    t, h, w, n = micro_batch * model.seq_len // cp, model.hidden, width, model.mtp_layers
    proj = _gemm("MTP projection", t, 2 * h, h // tp, n)
    head = head_ops(model, micro_batch, tp, width, cp)
    fwd = [
        Op("MTP embedding lookup", "memory", n * 2 * w * t * h),
        Op("MTP RMSNorms", "memory", n * 4 * w * t * h),
        proj,
        *(head["forward"] * n),
    ]
    bwd = [*(head["backward"] * n), *_backward_gemms(proj), Op("MTP RMSNorms backward", "memory", n * 8 * w * t * h)]
    return dict(forward=fwd, backward=bwd)


def embedding_ops(model, micro_batch: int, tp: int = 1, width: int = 2, cp: int = 1) -> dict:
    """The first stage's embedding lookup + dropout, and its gradient (a dense V/tp × h table, zeroed and
    accumulated each micro-batch)."""
    t, h = micro_batch * model.seq_len // cp, model.hidden
    table = width * (model.vocab // tp) * h if model.vocab else 0.0
    return dict(
        forward=[Op("embedding lookup + dropout", "memory", (4 * width + 1) * t * h)],
        backward=[Op("embedding grad", "memory", (2 * width + 1) * t * h + 2 * table)],
    )


LOW_PRECISION_EXEMPT = ("scores", "context P", "recompute scores", "recompute context", "router", "recompute router")


def gemm_parts(op: Op, hardware, strategy=None, processes: int = 1, threads=None):
    """(math, memory) seconds of a GEMM: its FLOPs at the GEMM efficiency for its size, and its own bytes at
    the achievable bandwidth for one GEMM of the batch."""
    m, k, n = op.shape
    dtype = strategy.dtype if strategy is not None else "bf16"
    if dtype in ("fp8", "fp4") and op.name.startswith(LOW_PRECISION_EXEMPT):
        dtype = "bf16"  # FP8/FP4 recipes convert the Linears only: attention's GEMMs and the router stay 16-bit
    if hardware.peak_flops:  # a GPU: the whole batched call sets the efficiency
        math = op.flops / gemm_shape_rate(hardware, (m, k, n), dtype, op.count)  # by shape where fitted
        kind = "mx" if dtype == "fp8" and strategy.fp8_recipe == "mx" else dtype
        if kind == "mx":  # block-scaled MXFP8 (Blackwell) below per-tensor FP8
            math /= MXFP8_GEMM_RATIO
        if op.name.endswith(("dgrad", "wgrad")):  # Blackwell: backward layouts slower (presets.BLACKWELL_BACKWARD_GEMM)
            math *= (hardware.backward_gemm_factor or {}).get(kind, 1.0)
    else:  # a calibrated CPU box: its measured table per GEMM
        math = op.count * gemm_time(m, k, n, hardware, dtype, processes, threads)
    return math, op.bytes / hardware.achievable_bandwidth(op.bytes / op.count, processes)


def op_time(op: Op, hardware, strategy=None, processes: int = 1, threads=None) -> float:
    """Seconds of one operator: a GEMM's roofline, a kernel's bytes at achievable bandwidth, a collective on
    the tensor-parallel group's placement."""
    if op.kind == "gemm":
        math, memory = gemm_parts(op, hardware, strategy, processes, threads)
        return math + memory if hardware.processing == "no_overlap" else max(math, memory)
    if op.kind == "memory":
        return op.bytes / hardware.achievable_bandwidth(op.bytes, processes, fp8_cast=" FP8 cast" in op.name)
    if op.kind == "attention":  # the tensor cores' share, unless the softmax's exponentials take longer
        math = op.flops / attention_rate(
            hardware, "backward" if "backward" in op.name else "forward", op.name.split()[0]
        )
        return max(math, op.exps / hardware.exp_rate) if getattr(hardware, "exp_rate", 0.0) else math
    if strategy is None:
        raise ValueError("a collective needs the strategy (its group's placement)")
    place = placement(strategy, hardware, op.group)
    if op.collective == "all_reduce" and place.nodes == 1:  # a CPU box whose ranks share cores: as measured there
        measured = in_situ_all_reduce(op.bytes / op.count, place.size, hardware, processes)
        if measured is not None:
            return op.count * measured
    share = 1.0
    if op.fanout and getattr(strategy, "ep_dispatcher", "alltoall") == "deepep":
        share = remote_copy_share(*op.fanout, place.nodes)
    return op.count * group_collective(op.collective, op.bytes / op.count, place, hardware, share)


def op_time_key(op: Op, hardware, strategy, processes: int = 1, threads=None, places: dict | None = None):
    """What :func:`op_time` reads besides ``hardware``, as a key for a memo of operator times over many
    strategies on one machine: the operator, the process and thread counts, and of the strategy only the dtype
    (a GEMM) or its group's placement on the nodes (a collective). ``places``: placements by group, reused."""
    if op.kind == "comm":
        places = {} if places is None else places
        place = places.get(op.group)
        if place is None:
            place = places[op.group] = placement(strategy, hardware, op.group)
        return (op, processes, threads, place, getattr(strategy, "ep_dispatcher", "") if op.fanout else "")
    if op.kind == "gemm":
        return (
            op,
            processes,
            threads,
            strategy.dtype if strategy is not None else "bf16",
            strategy.fp8_recipe if strategy is not None and strategy.dtype == "fp8" else "",
        )
    return (op, processes, threads)


def attention_rate(hardware, direction: str, kernel: str = "flash") -> float:
    """FLOP/s of a fused attention kernel: the fraction of the 16-bit peak it reaches on this machine
    (``Hardware.attention_efficiency``; a machine without one runs it at its large-GEMM rate). A machine with no
    figure for cuDNN's kernel (``"cudnn"``) runs it at FlashAttention-2's: before Hopper, Transformer Engine
    prefers flash-attn where both are installed."""
    table = hardware.attention_efficiency or {}
    eff = (table.get(kernel) or (table.get("flash") if kernel == "cudnn" else None) or {}).get(direction)
    dtype = "bf16" if "bf16" in (hardware.peak_flops or {}) else "fp16"
    if eff and hardware.peak_flops:
        return hardware.peak_flops[dtype] * eff
    return hardware.gemm_rate(1e3, dtype) if hardware.peak_flops else hardware.gemm_rate(1e3)


def ops_time(ops, hardware, strategy=None, processes=1, threads=None, kind=None) -> float:
    return sum(op_time(op, hardware, strategy, processes, threads) for op in ops if kind in (None, op.kind))
