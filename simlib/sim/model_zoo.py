"""Model constructors and the named sizes: :func:`gpt` (the transformer formulas of Narayanan et al. 2021),
:func:`transformer` and :func:`llama` (today's decoders: grouped-query attention, gated MLPs, RMSNorm, rotary
positions, mixtures of experts, latent attention), and the tables :data:`LLAMA_SIZES` / :data:`GPT_SIZES` with
:func:`llama_size` / :func:`gpt_size`. What a model asks of the machine (:class:`~simlib.sim.model.ModelSpec`)
lives in :mod:`simlib.sim.model`."""

from __future__ import annotations

import math

from .attention import mla_params, mtp_params
from .model import ModelSpec


def gpt(layers: int, hidden: int, heads: int, seq_len: int = 2048, vocab: int = 51200, name: str | None = None):
    """A GPT-style decoder: params = 12·L·h² + 13·L·h + V·h + s·h (weights, biases, layer norms, embeddings)."""
    for label, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    params = 12 * layers * hidden**2 + 13 * layers * hidden + vocab * hidden + seq_len * hidden
    label = name or f"GPT {params / 1e9:.1f}B"
    return ModelSpec(label, params, layers, hidden, seq_len=seq_len, heads=heads, vocab=vocab, kind="gpt")


def transformer(
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int = 2048,
    vocab: int = 51200,
    *,
    kv_heads: int = 0,
    ffn_hidden: int = 0,
    gated_mlp: bool = False,
    tied_embeddings: bool = True,
    norm: str = "layernorm",
    position: str = "learned",
    bias: bool = True,
    dropout: bool = True,
    experts: int = 0,
    top_k: int = 1,
    expert_ffn: int = 0,
    shared_experts: int = 0,
    dense_layers: int = 0,
    capacity_factor: float = 0.0,
    head_dim: int = 0,
    expert_bias: bool = False,
    router_bias: bool = False,
    q_lora: int = 0,
    kv_lora: int = 0,
    qk_nope: int = 0,
    qk_rope: int = 0,
    v_head: int = 0,
    mtp_layers: int = 0,
    window: int = 0,
    window_layers: int = 0,
    sinks: bool = False,
    activation_clamp: float = 0.0,
    rope_mscale: float = 1.0,
    name: str | None = None,
) -> ModelSpec:
    """A decoder-only transformer of any of today's families; parameters counted from its shapes.

    Per layer: Q and output projections h·h each, K and V h·(kv·d) each, the MLP (3 if gated else 2)·h·f,
    biases where ``bias``, and two norms (LayerNorm: weight and bias; RMSNorm: weight). Once: the embedding
    V·h (twice if untied), a learned position table s·h, and the final norm.

    ``experts`` > 0 makes the MLP of every layer after the first ``dense_layers`` a mixture of experts: a router
    (h·E), ``experts`` routed experts and ``shared_experts`` shared ones, each a (gated) MLP of width
    ``expert_ffn`` (default ``ffn_hidden``); each token goes to ``top_k`` routed experts (biases in them and in
    the router only with ``expert_bias`` / ``router_bias``: GPT-OSS has both, DeepSeek-V3 a router bias).

    Attention variants (:mod:`simlib.sim.attention`): ``kv_lora`` > 0 makes every layer's attention multi-head
    latent attention (``q_lora``, ``qk_nope``, ``qk_rope``, ``v_head``; no biases), counted by
    :func:`attention.mla_params` in place of Q, K, V, O; ``mtp_layers`` multi-token-prediction modules add
    :func:`attention.mtp_params` each (their block an MoE block when the model has experts; embedding and head
    shared); ``window``/``window_layers`` add no parameters; ``sinks`` adds one per head per layer.
    ``activation_clamp`` > 0: the gated activation clamps its two inputs first (GPT-OSS; no parameters);
    ``rope_mscale``: YaRN's factor on the rotary cos and sin (no parameters)."""
    for label, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    if hidden % heads and not head_dim:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}), or give head_dim")
    kv = kv_heads or heads
    if heads % kv:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
    d, f = head_dim or hidden // heads, ffn_hidden or 4 * hidden
    norm_params = (2 if norm == "layernorm" and bias else 1) * hidden
    if kv_lora:
        attention = mla_params(hidden, heads, q_lora, kv_lora, qk_nope, qk_rope, v_head)
    else:
        attention = 2 * hidden * heads * d + 2 * hidden * kv * d + (hidden + heads * d + 2 * kv * d if bias else 0)
    attention += heads if sinks else 0
    mlp = (3 if gated_mlp else 2) * hidden * f + ((2 if gated_mlp else 1) * f + hidden if bias else 0)
    per_layer = attention + mlp + 2 * norm_params
    moe_extra, moe_mlp = 0, mlp
    if experts:  # an MoE layer's MLP: the router, routed and shared experts instead of the dense MLP
        ef, g = expert_ffn or f, (2 if gated_mlp else 1)
        moe_mlp = (
            hidden * experts
            + (experts + shared_experts) * (g + 1) * hidden * ef
            + (experts if router_bias else 0)
            + (experts * (g * ef + hidden) if expert_bias else 0)
        )
        moe_extra = (layers - dense_layers) * (moe_mlp - mlp)
    if mtp_layers:
        moe_extra += mtp_layers * mtp_params(hidden, norm_params, per_layer - mlp + moe_mlp)
    params = (
        layers * per_layer
        + moe_extra
        + vocab * hidden * (1 if tied_embeddings else 2)
        + (seq_len * hidden if position == "learned" else 0)
        + norm_params
    )
    return ModelSpec(
        name or f"transformer {params / 1e9:.1f}B",
        params,
        layers,
        hidden,
        seq_len=seq_len,
        heads=heads,
        vocab=vocab,
        kind="gpt",
        kv_heads=kv if kv != heads else 0,
        ffn_hidden=f,
        gated_mlp=gated_mlp,
        tied_embeddings=tied_embeddings,
        norm=norm,
        position=position,
        dropout=dropout,
        experts=experts,
        top_k=top_k,
        expert_ffn=expert_ffn if experts else 0,
        shared_experts=shared_experts,
        dense_layers=dense_layers if experts else 0,
        capacity_factor=capacity_factor,
        head_size=head_dim if head_dim != hidden // heads else 0,
        q_lora=q_lora if kv_lora else 0,
        kv_lora=kv_lora,
        qk_nope=qk_nope if kv_lora else 0,
        qk_rope=qk_rope if kv_lora else 0,
        v_head=v_head if kv_lora else 0,
        mtp_layers=mtp_layers,
        window=window,
        window_layers=window_layers if window else 0,
        sinks=sinks,
        expert_bias=expert_bias and bool(experts),
        activation_clamp=activation_clamp,
        rope_mscale=rope_mscale,
    )


def llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    seq_len: int = 4096,
    vocab: int = 32000,
    name: str | None = None,
    **extra,
) -> ModelSpec:
    """A Llama-family decoder (Touvron et al. 2023; Llama 3: Dubey et al. 2024): grouped-query attention,
    SwiGLU MLP of width ``ffn_hidden``, RMSNorm, rotary positions, untied embeddings, no biases, no dropout.
    ``extra``: :func:`transformer`'s other arguments — experts (Mixtral is a Llama with 8 experts, top-2),
    attention variants (DeepSeek-V3's latent attention, GPT-OSS's windows and sinks), or a default overridden
    (GPT-OSS has biases)."""
    shape = dict(
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        gated_mlp=True,
        tied_embeddings=False,
        norm="rmsnorm",
        position="rope",
        bias=False,
        dropout=False,
    )
    return transformer(layers, hidden, heads, seq_len, vocab, name=name, **{**shape, **extra})


_GPT3 = dict(gated_mlp=False, norm="layernorm", position="learned", bias=True, dropout=True, tied_embeddings=True)
_NEMOTRON = dict(gated_mlp=False, norm="layernorm", position="rope", bias=False, dropout=False, tied_embeddings=False)

# Llama shapes from the model cards / torchtitan's model args (layers, hidden, heads, kv_heads, ffn, vocab, seq)
LLAMA_SIZES = {
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096),
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=13824, vocab=32000, seq_len=4096),
    "llama2-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000, seq_len=4096),
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, seq_len=8192),
    "llama3-405b": dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, seq_len=8192),
    # mixtures of experts with Llama-style layers, from their configs on the Hugging Face hub: Mixtral (Jiang et
    # al. 2024, mistralai/Mixtral-8x7B-v0.1, -8x22B-v0.1), DeepSeekMoE 16B (Dai et al. 2024,
    # deepseek-ai/deepseek-moe-16b-base: 64 fine-grained experts of 1408, 2 shared, top-6, first layer dense),
    # Qwen1.5-MoE-A2.7B (Qwen/Qwen1.5-MoE-A2.7B: 60 experts of 1408, top-4, one shared of 5632 = 4 x 1408)
    "mixtral-8x7b": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000, seq_len=4096, experts=8, top_k=2
    ),
    "mixtral-8x22b": dict(
        layers=56, hidden=6144, heads=48, kv_heads=8, ffn_hidden=16384, vocab=32768, seq_len=4096, experts=8, top_k=2
    ),
    "deepseek-moe-16b": dict(
        layers=28,
        hidden=2048,
        heads=16,
        kv_heads=16,
        ffn_hidden=10944,
        vocab=102400,
        seq_len=4096,
        experts=64,
        top_k=6,
        expert_ffn=1408,
        shared_experts=2,
        dense_layers=1,
    ),
    # Qwen3 MoE (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B configs): head_dim 128 (not hidden/heads), 128 experts
    "qwen3-30b-a3b": dict(
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        ffn_hidden=6144,
        vocab=151936,
        seq_len=4096,
        experts=128,
        top_k=8,
        expert_ffn=768,
        head_dim=128,
    ),
    "qwen3-235b-a22b": dict(
        layers=94,
        hidden=4096,
        heads=64,
        kv_heads=4,
        ffn_hidden=12288,
        vocab=151936,
        seq_len=4096,
        experts=128,
        top_k=8,
        expert_ffn=1536,
        head_dim=128,
    ),
    # DeepSeek-V3 (DeepSeek-AI 2024, technical report §4.2; deepseek-ai/DeepSeek-V3 config.json): 61 layers, the
    # first 3 dense (width 18432), then 1 shared + 256 routed experts of 2048, top-8, a router bias (§2.1.2);
    # multi-head latent attention with 128 heads, q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128; one
    # multi-token-prediction module (§2.2); vocabulary 129280
    "deepseek-v3": dict(
        layers=61,
        hidden=7168,
        heads=128,
        kv_heads=128,
        ffn_hidden=18432,
        vocab=129280,
        seq_len=4096,
        experts=256,
        top_k=8,
        expert_ffn=2048,
        shared_experts=1,
        dense_layers=3,
        router_bias=True,
        q_lora=1536,
        kv_lora=512,
        qk_nope=128,
        qk_rope=64,
        v_head=128,
        mtp_layers=1,
    ),
    # GPT-OSS-120B (OpenAI 2025, gpt-oss-120b model card §2; openai/gpt-oss-120b config.json): 36 layers, hidden
    # 2880, 64 query heads of 64, 8 KV heads, biases in attention, router and experts, 128 experts of 2880, top-4;
    # layers alternate a 128-token banded window and dense attention (18 each), a learned sink per head;
    # vocabulary 201088 (o200k_harmony); the gated activation's inputs clamped at 7 (config.json "swiglu_limit": 7.0;
    # Megatron-Bridge's GPTOSSProvider, activation_func_clamp_value=7.0); YaRN RoPE with factor 32 and no mscale
    # given, so Megatron-Core's concentration factor 0.1·ln 32 + 1 (``_yarn_get_concentration_factor``; config.json
    # "rope_scaling": yarn, factor 32; the provider's yarn_rotary_scaling_factor=32.0, yarn_mscale=None)
    "gpt-oss-120b": dict(
        layers=36,
        hidden=2880,
        heads=64,
        kv_heads=8,
        ffn_hidden=2880,
        vocab=201088,
        seq_len=4096,
        experts=128,
        top_k=4,
        expert_ffn=2880,
        head_dim=64,
        bias=True,
        expert_bias=True,
        router_bias=True,
        window=128,
        window_layers=18,
        sinks=True,
        activation_clamp=7.0,
        rope_mscale=0.1 * math.log(32) + 1,
    ),
    # NeMo's GPT-3 and Nemotron configs (NeMo-Framework-Launcher launcher_scripts/conf/training/{gpt3/5b, 20b, 175b,
    # nemotron/nemotron_8b, 22b, 340b}.yaml at commit 7316a8d9, 2024-09-10, the NeMo 24.07 release's time): GPT-3 —
    # learned positions, LayerNorm, biases, GeLU MLP of 4h, dropout 0.1, tied embeddings, GPT-2 BPE (50,257 padded
    # to a multiple of 128: 50,304); Nemotron — rotary positions, LayerNorm1p without biases, squared-ReLU MLP (not
    # gated; priced as the one element-wise activation GeLU's is), no dropout, untied, a 256,000-token
    # SentencePiece vocabulary (nemotron_2_256k), 340B with 8 query groups
    **{
        name: dict(layers=n, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=50304, seq_len=2048, **_GPT3)
        for name, n, h, a in (("gpt3-5b", 24, 4096, 32), ("gpt3-20b", 44, 6144, 48), ("gpt3-175b", 96, 12288, 96))
    },
    **{
        name: dict(layers=n, hidden=h, heads=a, kv_heads=kv, ffn_hidden=4 * h, vocab=256000, seq_len=4096, **_NEMOTRON)
        for name, n, h, a, kv in (
            ("nemotron-8b", 32, 4096, 32, 32),
            ("nemotron-22b", 40, 6144, 48, 48),
            ("nemotron-340b", 96, 18432, 96, 8),
        )
    },
    "qwen1.5-moe-a2.7b": dict(
        layers=24,
        hidden=2048,
        heads=16,
        kv_heads=16,
        ffn_hidden=5632,
        vocab=151936,
        seq_len=4096,
        experts=60,
        top_k=4,
        expert_ffn=1408,
        shared_experts=4,
    ),
}


def llama_size(label: str, seq_len: int | None = None) -> ModelSpec:
    if label not in LLAMA_SIZES:
        raise ValueError(f"unknown Llama size {label!r}: use one of {list(LLAMA_SIZES)}")
    shape = dict(LLAMA_SIZES[label])
    if seq_len is not None:
        shape["seq_len"] = seq_len
    return llama(**shape, name=label)


# GPT-style sizes used in the lesson (shapes as in GPT-3 Table 2.1, Brown et al. 2020, and Llama-2 7B/70B widths)
GPT_SIZES = {
    "1.3B": dict(layers=24, hidden=2048, heads=16),
    "7B": dict(layers=32, hidden=4096, heads=32),
    "70B": dict(layers=80, hidden=8192, heads=64),
}


def gpt_size(label: str, seq_len: int = 2048, vocab: int = 51200) -> ModelSpec:
    if label not in GPT_SIZES:
        raise ValueError(f"unknown GPT size {label!r}: use one of {list(GPT_SIZES)}")
    return gpt(**GPT_SIZES[label], seq_len=seq_len, vocab=vocab, name=f"GPT {label}")
