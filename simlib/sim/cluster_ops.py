"""Context- and expert-parallel operators of a layer at cluster scale (what :mod:`simlib.sim.layer` adds).

**Context parallelism** (cp ranks share each sequence, zig-zag split so that causal work is even: every rank
attends s/cp queries against the whole sequence, half masked). Three ways to bring each rank the keys and values
it needs, as Transformer Engine and DeepSpeed run them:

- ``allgather`` (Llama 3, Dubey et al. 2024 §3.3.2): all-gather K and V over the cp group before attention,
  reduce-scatter their gradients after (and all-gather again in backward); with grouped-query attention K/V are
  small, and the collective is exposed.
- ``ring`` (Liu et al. 2023, Ring Attention; TE's ``cp_comm_type="p2p"``): cp − 1 hops of one K/V block, each
  started before a block of attention and waited for after it; a hop is exposed only where it takes longer than
  one step's attention (1/cp of the rank's attention). Backward passes K/V and dK/dV together.
- ``ulysses`` (Jacobs et al. 2023, DeepSpeed-Ulysses): all-to-all Q, K, V from sequence to heads and the output
  back (four each way), exposed.

**Experts** (a mixture-of-experts MLP; Megatron-Core's all-to-all token dispatcher): the router GEMM (h → E) and
its softmax/top-k, a permute that groups each token's k copies by expert, the *dispatch* all-to-all over the ep
group, the experts' GEMMs as one grouped call per projection (E/ep local experts, rows = tokens × k on average,
times the load imbalance on the busiest rank), the *combine* all-to-all back, and an unpermute that weights and
sums the k outputs. Shared experts (DeepSeekMoE) run as a dense MLP beside them. With tp > 1 each tensor-parallel
rank routes its own sequence-parallel share of the tokens (Megatron's expert tensor parallelism of 1: experts
whole, not split over tp). Capacity (``ModelSpec.capacity_factor`` > 0) caps the busiest expert's rows at that
factor of the even share, so the imbalance counted is min(imbalance, capacity factor).
"""

from __future__ import annotations

from .ops import Op as _op
from .ops import _backward_gemms, _gemm, fp8_cast_bytes

# Seconds the host adds to an MoE layer's forward + backward for each expert on the rank, as Megatron-Core ran the
# published runs: its experts are Transformer Engine's GroupedLinear, which quantizes each local expert's rows on
# their own (``tex.split_quantize``) and launches one GEMM per local expert (``general_grouped_gemm`` takes lists of
# per-expert operands, ``num_gemms = len(A)``: transformer_engine/pytorch/module/grouped_linear.py and
# cpp_extensions/gemm.py), forward (fc1, fc2) and backward (dgrad and wgrad of each); the all-to-all dispatcher
# also copies the tokens-per-expert counts to the host before each dispatch, so the GPU queue is empty when those
# launches start. In most of these runs an expert's GEMM (a few hundred to a few thousand rows) runs in
# microseconds, less than its launches take, so the GPU waits on the host: a cost per local expert (E/ep), not per token. It replaces
# a flat 6.4 ms per layer pass (fitted the same way), which charged Qwen3-235B at ep 32 (4 local experts) as much
# as Qwen3-30B at ep 8 (16). FITTED, one quantity: the median over the 15 MoE rows of the *fit* half of
# ``data/scale_runs.csv`` of (measured − predicted step without it) / (MoE layer passes × local experts)
# (:func:`simlib.sim.scale_runs.fit_moe_host_per_expert`; 0.06–5.1 ms, middle half 0.31–0.45; 0.44 before the
# experts' FP8 gradient casts were priced; 0.378 with the 15th row, DeepSeek-V3's pp 8 × vp 4, now stated; 0.373 once
# GPT-OSS's eager expert operators and unfused YaRN RoPE were priced; 0.347 once Blackwell's FP8 casts and backward
# GEMMs were priced as Transformer Engine measured them, presets; 0.331 with the fit halves of two more sources,
# megatron-moe-modelzoo's 4 and nemo-automodel's 1 stated MoE rows; 0.345 once Megatron's expert grid (ep ranks
# consecutive over tp × cp × dp: topology.group_ranks), DeepEP's one crossing per node and Transformer Engine's cuDNN
# attention on Hopper were priced). Nothing of the test half was used. A third of it is charged to forward, two thirds
# to backward.
MOE_HOST_PER_LOCAL_EXPERT = 0.345e-3


def moe_host_overhead(model, strategy, hardware) -> float:
    """Seconds the host adds to one MoE layer's forward + backward on a GPU (:data:`MOE_HOST_PER_LOCAL_EXPERT` ×
    the experts on this rank); 0 on a calibrated CPU box, whose measured kernels include their dispatch."""
    if not (model.experts and hardware.peak_flops):
        return 0.0
    return MOE_HOST_PER_LOCAL_EXPERT * max(model.experts // strategy.ep, 1)


def cp_ops(model, micro_batch: int, tp: int, cp: int, kind: str, width: int = 2) -> dict:
    """The context-parallel collectives of one layer's attention, {"forward": [...], "backward": [...]}, on the
    "cp" group. Empty for cp = 1."""
    if cp == 1:
        return dict(forward=[], backward=[])
    b, s = micro_batch, model.seq_len
    kv_full = width * b * s * model.kv_width / tp  # K and V of the whole sequence on this tp rank
    if kind == "allgather":
        return dict(
            forward=[_op("CP all-gather K, V", "comm", kv_full, collective="all_gather", group="cp")],
            backward=[
                _op("CP all-gather K, V again", "comm", kv_full, collective="all_gather", group="cp"),
                _op("CP reduce-scatter dK, dV", "comm", kv_full, collective="reduce_scatter", group="cp"),
            ],
        )
    if kind == "ring":
        hop = kv_full / cp
        return dict(
            forward=[
                _op(
                    "CP ring K/V hops",
                    "comm",
                    (cp - 1) * hop,
                    count=cp - 1,
                    collective="p2p",
                    group="cp",
                    overlap="attention",
                )
            ],
            backward=[
                _op(
                    "CP ring K/V + dK/dV hops",
                    "comm",
                    2 * (cp - 1) * hop,
                    count=cp - 1,
                    collective="p2p",
                    group="cp",
                    overlap="attention",
                )
            ],
        )
    if kind == "ulysses":
        q = width * b * s / cp * model.hidden / tp  # one rank's Q (and the output)
        kv = width * b * s / cp * model.kv_width / 2 / tp  # one rank's K (and V)
        ins = [
            _op(f"Ulysses all-to-all {x}", "comm", size, collective="all_to_all", group="cp")
            for x, size in (("Q", q), ("K", kv), ("V", kv))
        ]
        out = [_op("Ulysses all-to-all output", "comm", q, collective="all_to_all", group="cp")]
        back = [
            _op(f"Ulysses all-to-all d{x}", "comm", size, collective="all_to_all", group="cp")
            for x, size in (("O", q), ("Q", q), ("K", kv), ("V", kv))
        ]
        return dict(forward=ins + out, backward=back)
    raise ValueError(f"cp_kind must be 'allgather', 'ring' or 'ulysses', got {kind!r}")


def expert_rows(model, tokens: float, imbalance: float = 1.0) -> float:
    """Rows (token copies) the busiest expert-parallel rank runs through its experts: tokens × top_k on
    average (every rank of the group sends as many as it receives), times the imbalance; a capacity factor
    caps it (and below 1 drops tokens even when balanced)."""
    skew = min(imbalance, model.capacity_factor) if model.capacity_factor else imbalance
    return tokens * model.top_k * skew


def expert_eager_ops(model, rows: float, width: int = 2) -> dict:
    """Memory-bound kernels GPT-OSS's experts add beside the fused ones, as Megatron-Core's ``TEGroupedMLP`` runs
    them (``megatron/core/transformer/moe/experts.py`` and ``fusions/fused_bias_geglu.py``, the same at Megatron-LM
    cba6b0ed and b0cc2706, the submodules of Megatron-Bridge v0.2.2 and v0.3.0: the 25.11 and 26.02 tables'
    releases), for ``rows`` token copies on the rank: {"clamp", "clamp_bwd", "bias", "bias_bwd"}, each a list.

    - **Clamped activation** (``model.activation_clamp``; GPT-OSS's ``activation_func_clamp_value=7``):
      ``weighted_bias_quick_geglu_impl`` clamps the two halves of fc1's output *before* its fused kernel, in eager
      PyTorch: ``chunk`` (views), ``x_glu.clamp(max=7)``, ``x_linear.clamp(-7, 7)``, ``torch.cat`` — each clamp
      reads and writes a half (rows × f), the cat reads both and writes the whole: 8·w bytes per rows × f element.
      Backward, as autograd runs it: the two-sided clamp's gradient is ``where((x >= lo) & (x <= hi), grad, 0)``
      (two comparisons, each reading x and writing a 1-byte mask, an in-place ``and`` of the masks, a ``where``
      reading mask and grad and writing the result), the one-sided one ``where(x <= hi, grad, 0)``, and the
      ``chunk``'s gradient concatenates the two halves: 11·w + 8 bytes. Megatron's ``--recompute-modules moe_act``
      checkpoints the whole activation function, so backward runs the forward clamps again.
    - **Experts' output bias** (``model.expert_bias``): fc2 is built with ``skip_bias_add=True``, so
      ``TEGroupedMLP._apply_bias`` adds each local expert's bias, weighted by the router's probability, in a
      Python loop over ``torch.split`` of the output: ``t + b * p`` per expert (``b * p`` written; it and ``t`` read,
      the sum written) and a ``torch.cat`` of the results: 6·w bytes per rows × h element. Backward: ``grad * p``
      summed over the rows (the bias's gradient) and ``grad * b`` summed over h (the probability's), each written
      and read again, and the ``split``'s gradient, a cat: 8·w. The router's probabilities are in the activations'
      dtype (``moe_router_dtype`` is unset in these recipes). fc1's bias is added in its GEMM
      (``skip_bias_add=False``) and its gradient comes from the weight-gradient GEMM (Transformer Engine's
      ``GroupedLinear``): free.
    These are the aten-level reads and writes of those sequences, as ``tests/test_sim_moe_eager.py`` counts them
    under PyTorch's dispatcher. The per-expert loop's launches are not priced (no per-launch term here)."""
    w, f, h = width, model.expert_width, model.hidden
    out = dict(clamp=[], clamp_bwd=[], bias=[], bias_bwd=[])
    if model.activation_clamp:
        out["clamp"] = [_op("experts activation clamp + cat (eager)", "memory", 8 * w * rows * f)]
        out["clamp_bwd"] = [_op("experts activation clamp backward (eager)", "memory", (11 * w + 8) * rows * f)]
    if model.expert_bias:
        out["bias"] = [_op("experts output bias x prob, per expert (eager)", "memory", 6 * w * rows * h)]
        out["bias_bwd"] = [_op("experts output bias backward (eager)", "memory", 8 * w * rows * h)]
    return out


def moe_ops(
    model,
    tokens: int,
    tp: int,
    ep: int,
    width: int = 2,
    imbalance: float = 1.0,
    sequence_parallel: bool = False,
    fp8=False,
    fp8_transpose: bool = True,
) -> dict:
    """The MoE MLP of one layer on one rank (after the second norm) for the ``tokens`` of its micro-batch
    (micro_batch × seq_len / cp), forward and backward, with the shared experts; the collectives on the "ep"
    group (dispatch, combine) and, for shared experts with tp > 1, the tensor-parallel ones."""
    w, h, E = width, model.hidden, model.experts
    t_full = tokens
    t = t_full / tp  # tokens this rank routes (its sequence-parallel share)
    rows = expert_rows(model, t, imbalance)
    local = E // ep
    g, f = (2 if model.gated_mlp else 1), model.expert_width
    per = max(int(round(rows / local)), 1)
    router = _gemm("router", int(t), h, E)
    up = _gemm("experts up" + (" + gate" if model.gated_mlp else "") + " (grouped)", per, h, g * f, local)
    down = _gemm("experts down (grouped)", per, f, h, local)
    a2a = ep > 1
    fan = (E, model.top_k)  # what a deduplicating dispatcher needs (topology.remote_copy_share)
    # FP8 (``fp8``: False or the recipe): each grouped GEMM's input is cast like a dense layer's (layer.layer_ops:
    # ops.fp8_cast_bytes, the recipe's bytes per element), forward and, for the incoming gradient, backward — which
    # the experts' list left out before (a test holds them to the dense rule)
    cast = fp8_cast_bytes(fp8, w, fp8_transpose)
    eager = expert_eager_ops(model, rows, w)  # GPT-OSS: the clamped activation and the experts' output bias
    fwd = [
        router,
        _op("router softmax + top-k (fp32)", "memory", 4 * 3 * t * E),
        _op("permute tokens to experts", "memory", 2 * w * rows * h),
        *(
            [_op("dispatch all-to-all", "comm", w * rows * h, collective="all_to_all", group="ep", fanout=fan)]
            if a2a
            else []
        ),
        *([_op("experts FP8 cast", "memory", cast * rows * h)] if fp8 else []),
        up,
        *eager["clamp"],
        _op("experts SwiGLU" if model.gated_mlp else "experts GeLU", "memory", (3 if g == 2 else 2) * w * rows * f),
        *([_op("experts FP8 cast (down)", "memory", cast * rows * f)] if fp8 else []),
        down,
        *eager["bias"],
        *(
            [_op("combine all-to-all", "comm", w * rows * h, collective="all_to_all", group="ep", fanout=fan)]
            if a2a
            else []
        ),
        _op("unpermute, weight by gate, sum", "memory", 2 * w * rows * h + w * t * h),
    ]
    bwd = [
        _op("unpermute backward", "memory", 2 * w * rows * h + w * t * h),
        *(
            [_op("combine backward all-to-all", "comm", w * rows * h, collective="all_to_all", group="ep", fanout=fan)]
            if a2a
            else []
        ),
        *eager["bias_bwd"],
        *([_op("experts down grad FP8 cast + transpose", "memory", cast * rows * h)] if fp8 else []),
        *_backward_gemms(down),
        _op("experts activation backward", "memory", (5 if g == 2 else 4) * w * rows * f),
        *eager["clamp_bwd"],
        *([_op("experts up grad FP8 cast + transpose", "memory", cast * rows * g * f)] if fp8 else []),
        *_backward_gemms(up),
        *(
            [_op("dispatch backward all-to-all", "comm", w * rows * h, collective="all_to_all", group="ep", fanout=fan)]
            if a2a
            else []
        ),
        _op("permute backward", "memory", 2 * w * rows * h),
        _op("router softmax backward", "memory", 4 * 3 * t * E),
        *_backward_gemms(router),
    ]
    if model.shared_experts:  # a dense MLP of width shared × f, split over tp like any MLP
        fs = model.shared_experts * f
        s_up, s_down = (
            _gemm("shared experts up", t_full, h, g * fs // tp),
            _gemm("shared experts down", t_full, fs // tp, h),
        )
        comm = tp > 1
        kind_in, kind_out = ("all_gather", "reduce_scatter") if sequence_parallel else ("", "all_reduce")
        full = w * t_full * h
        fwd += [
            *([_op("shared f all-gather", "comm", full, collective=kind_in)] if comm and kind_in else []),
            s_up,
            _op("shared experts activation", "memory", (3 if g == 2 else 2) * w * t_full * fs / tp),
            s_down,
            *([_op("shared g " + kind_out, "comm", full, collective=kind_out)] if comm else []),
        ]
        bwd += [
            *_backward_gemms(s_down),
            _op("shared experts activation backward", "memory", (5 if g == 2 else 4) * w * t_full * fs / tp),
            *_backward_gemms(s_up),
            *(
                [
                    _op(
                        "shared f backward " + ("reduce-scatter" if kind_in else "all-reduce"),
                        "comm",
                        full,
                        collective="reduce_scatter" if kind_in else "all_reduce",
                    )
                ]
                if comm
                else []
            ),
        ]
    return dict(forward=fwd, backward=bwd)


def is_attention(op) -> bool:
    """The attention core of a layer (the fused kernel, or the unfused scores, softmax and context): what a ring's
    K/V passes can overlap with."""
    return op.kind == "attention" or op.name.startswith(("scores", "context P", "scale+mask"))


def attention_time(ops, times) -> float:
    """Seconds of the attention core among ``ops`` (each op's time in ``times``, same order)."""
    return sum(t for op, t in zip(ops, times) if is_attention(op))


def exposed_comm(ops, times) -> float:
    """Seconds of the collectives in ``ops`` (each op's time in ``times``, same order) that compute does not
    hide: all of each, except a ring's K/V hops (``overlap="attention"``), where each of the ``count`` hops is
    exposed by what it takes beyond one ring step's attention (the rank's attention / (count + 1))."""
    attention = attention_time(ops, times)
    out = 0.0
    for op, t in zip(ops, times):
        if op.kind != "comm":
            continue
        if op.overlap == "attention":
            out += op.count * max(0.0, t / op.count - attention / (op.count + 1))
        else:
            out += t
    return out
