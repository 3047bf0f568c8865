"""Attention beyond grouped-query heads: multi-head latent attention, the multi-token-prediction head, sliding
windows and attention sinks — their parameters, GEMMs and kernel work, as :mod:`simlib.sim.model` and
:mod:`simlib.sim.layer` use them.

**Multi-head latent attention** (MLA; DeepSeek-V2, Liu et al. 2024 §2.1; DeepSeek-V3 technical report, DeepSeek-AI
2024, §2.1.1 and §4.2): the layer input ``h`` is compressed to a query latent of ``q_lora`` and a key/value latent
of ``kv_lora`` (each RMS-normalised), then projected up per head. Per layer (HF ``modeling_deepseek.py`` names):

    q_a_proj            h -> q_lora                       (+ q_a_layernorm: q_lora)
    q_b_proj            q_lora -> heads·(nope + rope)
    kv_a_proj_with_mqa  h -> kv_lora + rope               (the rotary key part, one per token, shared by all heads)
    kv_b_proj           kv_lora -> heads·(nope + v)       (+ kv_a_layernorm: kv_lora)
    o_proj              heads·v -> h

so a head's query and key have ``nope + rope`` dimensions and its value ``v``. Under tensor parallelism the two down
projections are replicated (Megatron-Core's MLA: ``linear_q_down_proj`` / ``linear_kv_down_proj`` are not split)
and the two up projections are column-parallel over the heads.

**Multi-token prediction** (DeepSeek-V3 report §2.2): each of ``mtp_layers`` modules takes the last hidden state and
the embedding of the next token, RMS-normalises both, concatenates them and projects 2h -> h (matrix M), runs one
more transformer block (an MoE block in DeepSeek-V3) and the *shared* output head with its own cross-entropy. The
embedding and the output head are the main model's (shared: not counted again). Megatron-Core places the modules
on the last pipeline stage.

**Sliding-window attention** (GPT-OSS model card, OpenAI 2025, §2: layers alternate between dense attention and a
banded window of 128 tokens; Child et al. 2019, Beltagy et al. 2020): a query at position i sees the keys
i − w + 1 .. i. Causal attention over s tokens has s·(s + 1)/2 visible (query, key) pairs, which this cost model
(like Dao 2023) counts as s²/2; a window of w < s has Σ min(i + 1, w) = s·w − w·(w − 1)/2, counted exactly. A kernel
that computes whole tiles does somewhat more for a narrow window; that is not priced. **Attention sinks** (same
card; Xiao et al. 2023): one learned logit per head added to each softmax's denominator: ``heads`` parameters a
layer and one more term per row of the softmax (no FLOPs worth counting).
"""

from __future__ import annotations


def mla_params(hidden: int, heads: int, q_lora: int, kv_lora: int, nope: int, rope: int, v: int) -> int:
    """Parameters of one MLA block's projections and its two latent norms (no biases: DeepSeek-V3 has none)."""
    return (
        hidden * q_lora
        + q_lora
        + q_lora * heads * (nope + rope)
        + hidden * (kv_lora + rope)
        + kv_lora
        + kv_lora * heads * (nope + v)
        + heads * v * hidden
    )


def mla_gemms(model, tokens: int, tp: int = 1) -> list[tuple[str, int, int, int]]:
    """MLA's projections before the attention kernel as (name, m, k, n) for ``tokens`` rows on one tensor-parallel
    rank: the down projections whole, the up projections split over the heads."""
    h, a = model.hidden, model.heads
    return [
        ("MLA q down", tokens, h, model.q_lora),
        ("MLA kv down", tokens, h, model.kv_lora + model.qk_rope),
        ("MLA q up", tokens, model.q_lora, a * (model.qk_nope + model.qk_rope) // tp),
        ("MLA kv up", tokens, model.kv_lora, a * (model.qk_nope + model.v_head) // tp),
    ]


def mtp_params(hidden: int, norm_params: int, block_params: int) -> int:
    """One multi-token-prediction module: two RMSNorms (hidden state, next token's embedding), the projection M
    (2h -> h), one transformer block and the norm before the shared head; embedding and head are shared."""
    return 3 * norm_params + 2 * hidden * hidden + block_params


def visible_pairs(seq: int, window: int = 0) -> float:
    """(query, key) pairs causal attention over ``seq`` tokens computes: seq²/2 (the model's convention for
    full causal attention), or exactly s·w − w·(w − 1)/2 with a sliding window of ``window`` < seq tokens."""
    if not window or window >= seq:
        return seq * seq / 2
    return seq * window - window * (window - 1) / 2


def mean_pairs(model, seq: int, cp: int = 1) -> float:
    """Visible pairs per sequence and head on one context-parallel rank, averaged over the model's layers
    (``window_layers`` of them windowed, the rest full); a balanced (zig-zag) split gives each rank 1/cp."""
    full = visible_pairs(seq)
    windowed = visible_pairs(seq, model.window) if model.window else full
    n, k = model.layers, model.window_layers if model.window else 0
    return ((n - k) * full + k * windowed) / n / cp
