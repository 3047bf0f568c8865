"""Memory per device: weights, gradients, optimizer states and activations, with ZeRO and recomputation.

- Mixed-precision Adam keeps 16 bytes per parameter: 2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master
  weights, momentum, variance); ZeRO stages 1/2/3 shard the 12, then the gradients, then the weights over the
  data-parallel ranks (Rajbhandari et al. 2020, ZeRO, §5).
- Activations of one transformer layer: s·b·h·(34 + 5·a·s/h) bytes without parallelism; with tensor and
  sequence parallelism all of it is divided by t; selective recomputation drops the 5·a·s/h (attention) term;
  full recomputation keeps only the layer input, 2·s·b·h (Korthikanti et al. 2022, Table 2).
- 1F1B keeps at most pp micro-batches in flight on the first stage, so it holds L layers' worth; GPipe keeps
  all m micro-batches (Narayanan et al. 2021; Korthikanti et al. 2022 §4.2). Interleaving v chunks per rank
  makes the first stage hold 1 + (p − 1)/(p·v) times that (Korthikanti et al. 2022 §4.2.3).
- Full recomputation keeps each layer's input, but backward rebuilds one layer's activations at a time: that
  one layer's full set is added on top (the working set of the recomputation).
- With pp = 1 the same device also holds the loss's fp32 logits, 4·b·s·V/tp bytes.
- Kept values take the compute dtype's bytes: 2 in mixed precision (Korthikanti's table), 4 in fp32 (dropout
  masks stay 1 byte; without dropout the scores term keeps only the softmax output).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .strategy import Strategy

# bytes per parameter: (weights, gradients, optimizer states)
BYTES_PER_PARAM = {
    ("mixed", "adam"): (2, 2, 12), ("mixed", "sgd"): (2, 2, 4), ("mixed", "sgd_momentum"): (2, 2, 8),
    ("fp32", "adam"): (4, 4, 8), ("fp32", "sgd"): (4, 4, 0), ("fp32", "sgd_momentum"): (4, 4, 4),
}


class DoesNotFit(ValueError):
    """A configuration needs more memory per device than the device has."""


def param_bytes(strategy):
    precision = "mixed" if strategy.mixed_precision else "fp32"
    return BYTES_PER_PARAM[(precision, strategy.optimizer)]


def kept_value_bytes(strategy) -> int:
    """Bytes of one value a layer keeps for backward: the compute dtype's (2 in mixed precision, 4 in fp32)."""
    return 2 if strategy.mixed_precision else 4


def activation_bytes_per_layer(model, micro_batch: int, tp: int = 1, recompute: str = "none",
                               sequence_parallel: bool = True, attention: str = "unfused",
                               value_bytes: int = 2) -> float:
    """Activation bytes one layer keeps for backward, for one micro-batch.

    Counted tensor by tensor as Korthikanti et al. 2022 (§4.1) do, for any shape: the inputs of the two norms,
    of the QKV projection and of the MLP (replicated over tensor-parallel ranks unless sequence-parallel), Q, K
    and V (grouped-query: K and V of kv heads), the attention output, the MLP's up (and gate) output and the
    down projection's input (and SwiGLU's silu(gate)), split over tp; a 1-byte mask per dropout. Unfused
    attention keeps the softmax output, its dropout mask and output, 5·a·s²·b bytes; FlashAttention keeps only
    its output and a log-sum-exp per row (Dao et al. 2022), so that term vanishes. For Megatron's GPT this is
    s·b·h·(34 + 5·a·s/h) (Korthikanti Table 2). Recomputation: selective drops the score term; ``op``
    (torchtitan) keeps the layer input, the outputs of every other GEMM and of the attention kernel; full keeps
    the layer input, 2·s·b·h; ``every_other`` keeps full sets on half the layers and inputs on the rest.
    ``value_bytes``: bytes of one kept value, 2 in mixed precision (the table's), 4 when the layer computes in
    fp32 (every term but the 1-byte dropout masks doubles).
    """
    if model.kind == "mlp":  # fp32: each Linear keeps its input (the previous ReLU's output)
        width = sum(i for i, _ in model.linears) / model.layers
        return 4.0 * width * micro_batch if recompute != "full" else 4.0 * model.linears[0][0] * micro_batch / model.layers
    s, b, h, a = model.seq_len, micro_batch, model.hidden, model.heads
    sb, x = s * b, value_bytes / 2   # x: a kept value's bytes over the 16-bit table's
    shard = tp if sequence_parallel else 1
    if recompute == "full":
        return 2.0 * x * sb * h / shard
    if recompute == "every_other":
        kept = activation_bytes_per_layer(model, micro_batch, tp, "none", sequence_parallel, attention, value_bytes)
        return (kept + 2.0 * x * sb * h / shard) / 2
    f, mask = model.ffn, (1 if model.dropout else 0)
    if recompute == "op":   # saved: every other GEMM output, the attention output, the block's input
        kvd = model.kv * model.head_dim
        if model.gated_mlp:   # mms Q, K, V, O, gate, up, down: Q, V, gate, down kept
            split = h + kvd + f + h
        else:                 # mms QKV, O, up, down: QKV and up kept
            split = model.qkv_width + f + h
        return 2.0 * x * sb * (split / tp + h / shard)
    replicated = 2 * x * 4 * h + 2 * mask * h                      # norm inputs, QKV and MLP inputs, masks
    if getattr(model, "mla", False):   # MLA: both latents, as their norms' and the up projections' inputs (whole
        replicated += 2 * x * 2 * (model.q_lora + model.kv_lora)  # on every tp rank: the down projections are)
    # Q, K, V, the attention output (heads × head_dim wide, or MLA's heads × v), the MLP's tensors
    split = 2 * x * (model.qkv_width + model.q_width + model.up_width + f + (f if model.gated_mlp else 0))
    # the softmax output, and with dropout its mask (1 byte) and output: 5·a·s²·b in Korthikanti's table
    scores = 0.0 if attention != "unfused" or recompute == "selective" else (
        (2 * x + mask * (1 + 2 * x)) * a * s * b * s / tp)
    return sb * (replicated / shard + split / tp) + scores


def in_flight_micro_batches(strategy) -> int:
    """Micro-batches whose activations one (first-stage) device holds at the peak."""
    if strategy.pp == 1:
        return 1  # accumulation: one micro-batch's activations at a time
    per_flush = strategy.num_micro_batches // getattr(strategy, "pipeline_flushes", 1)
    if strategy.schedule == "gpipe":
        return per_flush
    return min(strategy.pp, per_flush)


def moe_activation_delta(model, micro_batch: int, tp: int = 1, cp: int = 1, imbalance: float = 1.0,
                         recompute: str = "none") -> float:
    """Bytes an MoE layer keeps beyond a dense layer's (negative if less), for one micro-batch: the dense MLP's
    saved tensors (its input, up/gate output, activation) replaced by the router's fp32 probabilities, the
    permuted token copies the experts take (t/tp · k · imbalance rows: input, up/gate output, activation) and
    the shared experts' tensors (split over tp like a dense MLP). 0 under full recomputation (only the layer's
    input is kept)."""
    if not getattr(model, "experts", 0) or recompute in ("full",):
        return 0.0
    from .cluster_ops import expert_rows
    t = micro_batch * model.seq_len / cp
    g, f = (2 if model.gated_mlp else 1), model.expert_width
    dense = 2.0 * t * (model.up_width + model.ffn + (model.ffn if model.gated_mlp else 0)) / tp
    rows = expert_rows(model, t / tp, imbalance)
    routed = 2.0 * rows * (model.hidden + g * f + (f if g == 2 else 0)) + 4.0 * t / tp * model.experts
    fs = model.shared_experts * f
    shared = 2.0 * t * (g * fs + (fs if g == 2 else 0)) / tp
    return routed + shared - dense


def interleave_factor(strategy) -> float:
    """Extra activation memory of the interleaved schedule on the first stage: 1 + (p − 1)/(p·v) for v > 1."""
    p, v = strategy.pp, strategy.virtual_stages
    return 1.0 + (p - 1) / (p * v) if v > 1 and p > 1 else 1.0


def memory_per_device(model, strategy) -> dict:
    """Bytes per device: weights, gradients, optimizer, activations and total (first pipeline stage).

    Context parallelism: each rank keeps the activations of s/cp tokens; weights are replicated over cp and
    (dense) states sharded over dp × cp under ZeRO (Megatron's distributed optimizer). Experts: a rank holds
    E/ep of them whole, their states sharded over the dp × cp / ep ranks that hold the same experts."""
    w_b, g_b, o_b = param_bytes(strategy)
    cp, ep = getattr(strategy, "cp", 1), getattr(strategy, "ep", 1)
    experts = model.expert_params if getattr(model, "experts", 0) else 0
    stages = strategy.stage_layers(model.layers) if model.kind == "gpt" and (
        strategy.virtual_stages == 1 or getattr(strategy, "stage_layout", ())) else None
    share = stages[0] / model.layers if stages else 1 / strategy.pp   # the first stage's share of the layers
    dense_here = (model.params - experts) / (strategy.tp * strategy.pp)
    expert_here = experts * share / ep
    dp, edp = strategy.shard_degree, max(1, strategy.dp * cp // ep)
    params_here = dense_here + expert_here

    def sharded(nbytes, stage):
        return nbytes * (dense_here / (dp if strategy.zero_stage >= stage else 1)
                         + expert_here / (edp if strategy.zero_stage >= stage else 1))
    weights, grads, optimizer = sharded(w_b, 3), sharded(g_b, 2), sharded(o_b, 1)
    layers_here = model.layers * share + (getattr(model, "mtp_layers", 0) if strategy.pp == 1 else 0)
    seq_model = replace(model, seq_len=model.seq_len // cp) if cp > 1 else model
    value = kept_value_bytes(strategy)
    per_layer = activation_bytes_per_layer(seq_model, strategy.micro_batch, strategy.tp, strategy.recompute,
                                           strategy.sequence_parallel, strategy.attention, value)
    moe_here = max(0, layers_here - model.dense_layers) if getattr(model, "experts", 0) else 0
    moe_extra = moe_activation_delta(model, strategy.micro_batch, strategy.tp, cp, strategy.expert_imbalance,
                                     strategy.recompute) if moe_here else 0.0
    if strategy.recompute == "full" and strategy.recompute_layers:   # only that many layers recomputed
        kept = activation_bytes_per_layer(seq_model, strategy.micro_batch, strategy.tp, "none",
                                          strategy.sequence_parallel, strategy.attention, value)
        r = min(strategy.recompute_layers, layers_here)
        stage_acts = r * per_layer + (layers_here - r) * kept
    else:
        stage_acts = per_layer * layers_here + moe_here * moe_extra
    stage_acts -= strategy.offloaded(layers_here) * per_layer   # on the host (simlib.sim.offload)
    activations = stage_acts * in_flight_micro_batches(strategy) * interleave_factor(strategy)
    if strategy.recompute in ("full", "every_other", "op") and model.kind == "gpt":
        activations += activation_bytes_per_layer(seq_model, strategy.micro_batch, strategy.tp, "none",
                                                  strategy.sequence_parallel, strategy.attention, value) + moe_extra
    if strategy.fsdp and model.kind == "gpt":
        # FSDP's working set: the unit being computed and the one prefetched, gathered in the parameter dtype,
        # and their unsharded gradients before the reduce-scatter (Zhao et al. 2023 §3.2)
        per_unit = params_here / model.layers * strategy.pp
        reduce_b = {"fp32": 4, "tf32": 4}.get(strategy.reduce_dtype, g_b)
        weights += 2 * per_unit * w_b if strategy.zero_stage >= 3 else 0.0
        grads += 2 * per_unit * reduce_b
    if model.kind == "gpt" and model.vocab and strategy.pp == 1:
        activations += 4.0 * strategy.micro_batch * model.seq_len / cp * model.vocab / strategy.tp
    total = weights + grads + optimizer + activations
    return dict(weights=weights, gradients=grads, optimizer=optimizer, activations=activations, total=total)


def check_fits(model, strategy, hardware, headroom: float = 0.9) -> dict:
    """Memory per device, or :class:`DoesNotFit` if it exceeds ``headroom`` × the device's capacity."""
    mem = memory_per_device(model, strategy)
    limit = headroom * hardware.memory_bytes
    if mem["total"] > limit:
        parts = ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in mem.items() if k != "total")
        raise DoesNotFit(f"{model.name} with dp={strategy.dp} tp={strategy.tp} pp={strategy.pp} "
                         f"zero={strategy.zero_stage} needs {mem['total'] / 1e9:.1f} GB per device ({parts}); "
                         f"{hardware.name} has {hardware.memory_bytes / 1e9:.0f} GB ({headroom:.0%} usable). "
                         "Try a higher ZeRO stage, more tp/pp, a smaller micro-batch or recomputation.")
    return mem


def min_devices_to_fit(model, hardware, strategy=None, headroom: float = 0.9) -> int:
    """Smallest world size (ZeRO-3 data parallelism) whose weights+grads+optimizer fit: the memory wall."""

    strategy = strategy or Strategy()
    w_b, g_b, o_b = param_bytes(strategy)
    per_param = w_b + g_b + o_b
    return max(1, math.ceil(model.params * per_param / (headroom * hardware.memory_bytes)))
