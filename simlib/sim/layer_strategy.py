"""A layer's operators under a strategy: the GEMMs of a linear-layer model, what recomputation (full, selective,
per module) runs again in backward, the operators of one layer as a :class:`~simlib.sim.strategy.Strategy` runs it,
and :func:`operator_table` (every operator of a layer with its FLOPs, bytes, time and bound). The operators
themselves and their pricing live in :mod:`simlib.sim.layer`."""

from __future__ import annotations

from dataclasses import replace

from .layer import gemm_parts, layer_ops, op_time
from .ops import _gemm


def linear_gemms(model, forward):
    """The layer's Linear GEMMs in the order a framework issues them (one ``mm`` each): Llama-style models
    project Q, K, V separately and the gate and up separately (torchtitan), others fuse QKV (Megatron, MPT)."""
    gemms = [op for op in forward if op.kind == "gemm" and not op.name.startswith(("scores", "context"))]
    if not model.gated_mlp:
        return gemms
    out = []
    for op in gemms:
        m, k, n = op.shape
        if op.name == "QKV":
            q = n * model.q_width // model.qkv_width
            kv = (n - q) // 2
            out += [_gemm("Q", m, k, q), _gemm("K", m, k, kv), _gemm("V", m, k, kv)]
        elif op.name.startswith("MLP up") and model.gated_mlp:
            out += [_gemm("MLP gate", m, k, n // 2), _gemm("MLP up", m, k, n // 2)]
        else:
            out.append(op)
    return out


def recompute_ops(forward, recompute: str, model=None):
    """What backward re-runs: full — the whole forward of the layer (its collectives too); selective — the
    attention core only (scores, softmax, dropout, context: Korthikanti et al. 2022 §5; with FlashAttention
    the fused kernel recomputes its own scores, so nothing more); op — torchtitan's per-op policy, which saves
    the outputs of the GEMMs and of the attention kernel *except every second GEMM*, and recomputes the rest
    (the memory-bound kernels and those GEMMs: torchtitan ``activation_checkpoint.py``); none — nothing.
    ("every_other", full recomputation of every second layer, is applied per layer by the caller.)"""

    def again(op):
        return replace(op, name=f"recompute {op.name}")

    if recompute == "full":
        return [again(op) for op in forward]
    if recompute == "selective":
        core = ("scores", "scale+mask", "attention dropout", "context P")
        return [again(op) for op in forward if op.name.startswith(core)]
    if recompute == "op":
        mms = linear_gemms(model, forward) if model is not None else [op for op in forward if op.kind == "gemm"]
        return [again(op) for op in forward if op.kind == "memory"] + [again(op) for op in mms[1::2]]
    return []


# What each of Megatron-Core's --recompute-modules re-runs in backward (TransformerConfig.recompute_modules): the two
# norms before attention and MLP, the experts' activation, MLA's up projections with the rotary part, a dense MLP
RECOMPUTE_MODULE_OPS = {
    "layernorm": ("RMSNorm 1", "RMSNorm 2", "layer norm 1", "layer norm 2"),
    "moe_act": ("experts SwiGLU", "experts GeLU", "experts activation clamp"),
    "mla_up_proj": ("MLA q up", "MLA kv up", "rotary embedding on Q, K"),
    "mlp": ("MLP up", "MLP down", "SwiGLU silu·up", "bias+GeLU (fused)"),
    # the whole MoE layer under one checkpoint (Megatron-Core's "moe": router, permutation, both all-to-alls, the
    # routed and shared experts; cluster_ops.moe_ops' operators)
    "moe": (
        "router",
        "permute tokens",
        "dispatch all-to-all",
        "experts ",
        "combine all-to-all",
        "unpermute",
        "shared ",
    ),
}


def module_recompute_ops(forward, modules) -> list:
    """The forward operators of ``modules`` (:data:`RECOMPUTE_MODULE_OPS`; their FP8 casts included) that
    backward re-runs, named "recompute ..."."""
    names = tuple(n for m in modules for n in RECOMPUTE_MODULE_OPS[m])
    return [replace(op, name=f"recompute {op.name}") for op in forward if names and op.name.startswith(names)]


def strategy_layer_ops(model, strategy, expert_layer: bool = False, hardware=None) -> dict:
    """:func:`layer_ops` for one micro-batch of ``strategy`` (an MoE layer if ``expert_layer``) on ``hardware``
    (whether its FP8 casts write a transposed copy: ``Hardware.fp8_transpose``; None: they do)."""
    s = strategy
    return layer_ops(
        model,
        s.micro_batch,
        s.tp,
        s.sequence_parallel,
        2 if s.mixed_precision else 4,
        s.attention,
        s.fp8_recipe if s.dtype in ("fp8", "fp4") else False,
        s.kernels,
        s.cp,
        s.cp_kind,
        s.ep,
        expert_layer,
        s.expert_imbalance,
        getattr(hardware, "fp8_transpose", True),
    )


def operator_table(model, hardware, strategy, processes: int = 1):
    """One row per operator of one layer (forward, recomputation, backward) for one micro-batch: kind,
    GFLOPs, MB moved, milliseconds, achieved TFLOP/s and which limit binds (math, memory, link)."""
    import pandas as pd

    s = strategy
    ops = strategy_layer_ops(model, s, expert_layer=bool(getattr(model, "experts", 0)), hardware=hardware)
    rows = []
    again = recompute_ops(
        ops["forward"], "full" if s.recompute == "every_other" else s.recompute, model
    ) + module_recompute_ops(ops["forward"], s.recompute_modules)
    for phase, items in (("forward", ops["forward"]), ("recompute", again), ("backward", ops["backward"])):
        for op in items:
            t = op_time(op, hardware, s, processes, s.threads)
            bound = ""
            if op.kind == "attention":
                bound = "math"
            if op.kind == "gemm":  # whichever of the GEMM's math and its own memory traffic takes longer
                math, memory = gemm_parts(op, hardware, s, processes, s.threads)
                bound = "math" if math >= memory else "memory"
            rows.append(
                dict(
                    phase=phase,
                    op=op.name,
                    kind=op.kind,
                    gflops=op.flops / 1e9,
                    mb=op.bytes / 1e6,
                    ms=t * 1e3,
                    tflops=op.flops / t / 1e12 if t and op.flops else 0.0,
                    bound=bound or {"memory": "memory", "comm": "link"}[op.kind],
                )
            )
    return pd.DataFrame(rows)
