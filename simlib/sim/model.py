"""What a model asks of the machine: parameters, GEMMs (hence FLOPs) and activation bytes per sample.

Two sources: :func:`from_module` counts a torch module's Linear layers (the course's MLPs), :func:`gpt` uses the
transformer formulas. For GPT the forward GEMMs per layer are QKV (h→3h), attention scores and values
(2·s·h per token each), the output projection (h→h) and the MLP (h→4h→h), plus the logits (h→V) once:
forward+backward FLOPs per iteration = 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) (Narayanan et al. 2021, eq. 3),
i.e. ≈ 6·N FLOPs per token plus the attention term (Kaplan et al. 2020).

Today's decoders differ in ways the cost model must see (:func:`transformer`, :func:`llama`): grouped-query
attention (K and V projected to ``kv_heads`` < ``heads`` heads: Ainslie et al. 2023), a gated MLP (SwiGLU: three
h×f matrices with f ≈ 8h/3 rounded, Shazeer 2020; Llama: Touvron et al. 2023), untied input and output
embeddings, RMSNorm instead of LayerNorm (one statistic, no bias: Zhang & Sennrich 2019), rotary positions (no
position table: Su et al. 2021) or a learned table (GPT, MPT), and no dropout. Model FLOPs count every GEMM with
the full s×s attention (the convention of Narayanan et al. eq. 3, llm-foundry's MFU and torchtitan's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .attention import mla_gemms, mla_params, mtp_params


@dataclass(frozen=True)
class ModelSpec:
    """A model as the cost model sees it. ``linears``: (in, out) of each Linear of an MLP, in forward order."""

    name: str
    params: int
    layers: int                  # repeated blocks: pipeline stages split these
    hidden: int
    seq_len: int = 1             # tokens per sample (1 for an MLP)
    heads: int = 1
    vocab: int = 0
    linears: tuple = ()          # MLP only
    kind: str = "mlp"            # "mlp" | "gpt"
    activation_width: int = 0    # MLP: sum of widths of element-wise (ReLU) outputs per sample
    param_numels: tuple = ()     # MLP: numel of each parameter in registration order (for bucket plans)
    rows: tuple = ()             # MLP: GEMM rows per sample of each entry of ``linears`` (default 1 each; a
                                 # convolution as im2col GEMM has one row per output pixel)
    kv_heads: int = 0            # GPT: key/value heads (grouped-query attention); 0: as many as ``heads``
    ffn_hidden: int = 0          # GPT: MLP inner width f; 0: 4·hidden
    gated_mlp: bool = False      # GPT: SwiGLU (gate and up projections h→f, then f→h) instead of h→4h→h with GeLU
    tied_embeddings: bool = True  # GPT: the logits reuse the input embedding table
    norm: str = "layernorm"      # GPT: "layernorm" | "rmsnorm"
    position: str = "learned"    # GPT: "learned" (a table of s×h) | "rope" | "alibi" (no parameters)
    dropout: bool = True         # GPT: dropout after attention and the residual branches (Megatron's GPT: yes)
    # mixture of experts (GPT only; 0 experts: a dense model). Switch Transformer (Fedus et al. 2021), Mixtral
    # (Jiang et al. 2024), DeepSeekMoE's fine-grained and shared experts (Dai et al. 2024)
    experts: int = 0             # routed experts per MoE layer
    top_k: int = 1               # experts each token is routed to
    expert_ffn: int = 0          # inner width of one expert (0: ffn); fine-grained experts are narrower
    shared_experts: int = 0      # experts every token goes through (DeepSeekMoE), each of width expert_ffn
    dense_layers: int = 0        # leading layers with a dense MLP instead (DeepSeek-V3: the first 3)
    capacity_factor: float = 0.0  # tokens an expert takes, over the even share (0: dropless, no cap)
    head_size: int = 0           # GPT: head dimension when it is not hidden / heads (Qwen3: 128); 0: hidden/heads
    # attention variants (simlib.sim.attention): multi-head latent attention when kv_lora > 0 (DeepSeek-V2/V3),
    # multi-token-prediction modules, sliding windows on some layers and attention sinks (GPT-OSS)
    q_lora: int = 0              # MLA: query latent width (DeepSeek-V3: 1536)
    kv_lora: int = 0             # MLA: key/value latent width (512); 0: not MLA
    qk_nope: int = 0             # MLA: per-head query/key dimensions without rotary (128)
    qk_rope: int = 0             # MLA: per-head rotary query/key dimensions, the key's shared by all heads (64)
    v_head: int = 0              # MLA: per-head value dimension (128)
    mtp_layers: int = 0          # multi-token-prediction modules after the last layer (DeepSeek-V3: 1)
    window: int = 0              # sliding-window width in tokens on ``window_layers`` of the layers (0: none)
    window_layers: int = 0       # how many layers use the window (GPT-OSS: every second one, 18 of 36)
    sinks: bool = False          # a learned attention-sink logit per head in every layer (GPT-OSS)
    expert_bias: bool = False    # biases in the routed experts' projections (GPT-OSS; priced in cluster_ops)
    activation_clamp: float = 0.0  # the gated activation's inputs clamped to this bound first (GPT-OSS: 7; 0: none)
    rope_mscale: float = 1.0     # YaRN's concentration factor on RoPE's cos and sin (GPT-OSS: 0.1·ln 32 + 1; layer.py)

    def __post_init__(self):
        for name in ("params", "layers", "hidden", "seq_len", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.kind not in ("mlp", "gpt"):
            raise ValueError(f"kind must be 'mlp' or 'gpt', got {self.kind!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.position not in ("learned", "rope", "alibi"):
            raise ValueError(f"position must be 'learned', 'rope' or 'alibi', got {self.position!r}")
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.experts:
            if self.kind != "gpt" or self.experts < 1 or not 1 <= self.top_k <= self.experts:
                raise ValueError(f"an MoE GPT needs experts >= 1 and 1 <= top_k <= experts, got experts="
                                 f"{self.experts}, top_k={self.top_k}")
            if not 0 <= self.dense_layers < self.layers or self.capacity_factor < 0 or self.shared_experts < 0:
                raise ValueError(f"dense_layers must be in [0, layers), capacity_factor and shared_experts >= 0; "
                                 f"got {self.dense_layers}, {self.capacity_factor}, {self.shared_experts}")
        if self.kv_lora and not (self.q_lora > 0 and self.qk_nope > 0 and self.qk_rope > 0 and self.v_head > 0):
            raise ValueError(f"multi-head latent attention needs q_lora, qk_nope, qk_rope and v_head > 0, got "
                             f"{self.q_lora}, {self.qk_nope}, {self.qk_rope}, {self.v_head}")
        if self.activation_clamp < 0 or self.rope_mscale <= 0:
            raise ValueError(f"activation_clamp must be >= 0 (0: no clamp) and rope_mscale > 0, got "
                             f"{self.activation_clamp}, {self.rope_mscale}")
        if self.window < 0 or not 0 <= self.window_layers <= self.layers or self.mtp_layers < 0:
            raise ValueError(f"window >= 0, window_layers in [0, layers] and mtp_layers >= 0, got {self.window}, "
                             f"{self.window_layers}, {self.mtp_layers}")

    @property
    def kv(self) -> int:
        """Key/value heads (= heads without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        """MLP inner width f."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora > 0

    @property
    def attention_dim(self) -> float:
        """The head dimension the attention kernel's FLOPs see: d, or MLA's mean of query/key (nope + rope) and
        value dimensions (Q·Kᵀ runs over the first, P·V over the second)."""
        return (self.qk_nope + self.qk_rope + self.v_head) / 2 if self.mla else self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the attention output before its projection: heads × head_dim (MLA: heads × v_head)."""
        return self.heads * (self.v_head if self.mla else self.head_dim)

    @property
    def kv_width(self) -> int:
        """Width of K and V together as the attention kernel reads them: 2·kv·d (MLA: heads·(nope + rope + v))."""
        if self.mla:
            return self.heads * (self.qk_nope + self.qk_rope + self.v_head)
        return 2 * self.kv * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Width of Q, K and V: the fused QKV projection's output, h for Q and 2·kv·d for K and V (MLA: what the
        up projections and the rotary part give the kernel, heads·(2·(nope + rope) + v))."""
        if self.mla:
            return self.heads * (self.qk_nope + self.qk_rope) + self.kv_width
        return self.heads * self.head_dim + self.kv_width

    @property
    def up_width(self) -> int:
        """Output width of the MLP's first GEMM: f, or 2f for a gated MLP (gate and up fused)."""
        return self.ffn * (2 if self.gated_mlp else 1)

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_width(self) -> int:
        """Inner width of one expert."""
        return self.expert_ffn or self.ffn

    @property
    def expert_params(self) -> int:
        """Parameters of the routed experts over all MoE layers (split over expert-parallel ranks)."""
        blocks = self.moe_layers + (self.mtp_layers if self.experts else 0)   # an MTP block is an MoE block too
        return blocks * self.experts * (3 if self.gated_mlp else 2) * self.hidden * self.expert_width

    def mlp_gemms(self, t: int, tp: int, layers: int, moe: bool):
        """The MLP's forward GEMMs for ``t`` tokens over ``layers`` layers: a dense MLP, or the router, the
        routed experts (t·k rows in all, as one grouped call per layer) and the shared experts."""
        h = self.hidden
        if not moe:
            return [(t, h, self.up_width // tp, layers), (t, self.ffn // tp, h, layers)]
        g, f = (2 if self.gated_mlp else 1), self.expert_width
        out = [(t, h, self.experts, layers), (t * self.top_k, h, g * f, layers), (t * self.top_k, f, h, layers)]
        if self.shared_experts:
            fs = self.shared_experts * f
            out += [(t, h, g * fs // tp, layers), (t, fs // tp, h, layers)]
        return out

    def forward_gemms(self, micro_batch: int, tp: int = 1, layers: int | None = None):
        """GEMMs of one forward pass over ``layers`` blocks as (m, k, n, count); TP splits them Megatron-style."""
        if micro_batch < 1 or tp < 1:
            raise ValueError(f"micro_batch and tp must be >= 1, got {micro_batch}, {tp}")
        layers = self.layers if layers is None else layers
        if self.kind == "mlp":
            rows = self.rows or (1,) * len(self.linears)
            per_layer = [(micro_batch * r, i, o, 1) for (i, o), r in zip(self.linears, rows)]
            return per_layer if layers == self.layers else per_layer[:layers]
        moe = self.moe_layers if layers == self.layers else round(self.moe_layers * layers / self.layers)
        windowed = self.window_layers if layers == self.layers else round(self.window_layers * layers / self.layers)
        gemms = self._block_gemms(micro_batch, tp, layers, moe, windowed)
        t, h = micro_batch * self.seq_len, self.hidden
        if layers == self.layers and self.vocab:
            gemms.append((t, h, self.vocab // tp, 1))                    # logits
        if layers == self.layers and self.mtp_layers:                  # multi-token prediction (attention.py)
            n = self.mtp_layers
            gemms += [(t, 2 * h, h, n), *self._block_gemms(micro_batch, tp, n, n if self.experts else 0, 0),
                      *([(t, h, self.vocab // tp, n)] if self.vocab else [])]
        return gemms

    def _block_gemms(self, micro_batch: int, tp: int, layers: int, moe: int, windowed: int):
        """Forward GEMMs of ``layers`` transformer blocks, ``moe`` of them with experts and ``windowed`` of them
        with the sliding window (each query against ``window`` keys instead of the whole sequence)."""
        t, h, s, a = micro_batch * self.seq_len, self.hidden, self.seq_len, self.heads
        heads_here = max(a // tp, 1)
        if self.mla:
            gemms = [(m, k, n, layers) for _, m, k, n in mla_gemms(self, t, tp)]   # latent down/up projections
        else:
            gemms = [(t, h, self.qkv_width // tp, layers)]                # QKV, column-parallel
        d_qk = self.qk_nope + self.qk_rope if self.mla else self.head_dim
        d_v = self.v_head if self.mla else self.head_dim
        windowed = windowed if self.window and self.window < s else 0
        for n, keys in ((layers - windowed, s), (windowed, self.window)):
            if n:
                gemms += [(s, d_qk, keys, micro_batch * heads_here * n),  # scores Q·Kᵀ per head
                          (s, keys, d_v, micro_batch * heads_here * n)]   # scores · V
        gemms.append((t, self.q_width // tp, h, layers))                 # output projection, row-parallel
        if layers - moe:
            gemms += self.mlp_gemms(t, tp, layers - moe, False)          # MLP up (and gate), down
        if moe:
            gemms += self.mlp_gemms(t, tp, moe, True)
        return gemms

    def forward_flops(self, micro_batch: int, tp: int = 1) -> float:
        return sum(2 * m * k * n * c for m, k, n, c in self.forward_gemms(micro_batch, tp))

    def flops_per_sample(self) -> float:
        """Model FLOPs of forward + backward per sample (backward = 2 × forward), the numerator of MFU."""
        return 3 * self.forward_flops(1)

    def flops_per_token(self) -> float:
        return self.flops_per_sample() / self.seq_len

    def elementwise_bytes(self, micro_batch: int) -> float:
        """MLP: bytes that element-wise ops (ReLU forward and backward) move per micro-batch (fp32)."""
        return 4.0 * 5 * self.activation_width * micro_batch if self.kind == "mlp" else 0.0


def from_module(module, name: str | None = None) -> ModelSpec:
    """Count a torch module: parameters, and each ``nn.Linear`` (in forward order = registration order)."""
    from torch import nn

    linears = tuple((m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear))
    if not linears:
        raise ValueError("from_module counts nn.Linear layers; this module has none")
    relu_width = 0
    last_out = None
    for m in module.modules():
        if isinstance(m, nn.Linear):
            last_out = m.out_features
        elif isinstance(m, (nn.ReLU, nn.GELU, nn.Tanh)) and last_out:
            relu_width += last_out
    params = sum(p.numel() for p in module.parameters())
    return ModelSpec(name or type(module).__name__, int(params), len(linears), max(o for _, o in linears),
                     linears=linears, kind="mlp", activation_width=relu_width,
                     param_numels=tuple(p.numel() for p in module.parameters() if p.requires_grad))


def gpt(layers: int, hidden: int, heads: int, seq_len: int = 2048, vocab: int = 51200, name: str | None = None):
    """A GPT-style decoder: params = 12·L·h² + 13·L·h + V·h + s·h (weights, biases, layer norms, embeddings)."""
    for label, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    params = 12 * layers * hidden ** 2 + 13 * layers * hidden + vocab * hidden + seq_len * hidden
    label = name or f"GPT {params / 1e9:.1f}B"
    return ModelSpec(label, params, layers, hidden, seq_len=seq_len, heads=heads, vocab=vocab, kind="gpt")


def transformer(layers: int, hidden: int, heads: int, seq_len: int = 2048, vocab: int = 51200, *,
                kv_heads: int = 0, ffn_hidden: int = 0, gated_mlp: bool = False, tied_embeddings: bool = True,
                norm: str = "layernorm", position: str = "learned", bias: bool = True, dropout: bool = True,
                experts: int = 0, top_k: int = 1, expert_ffn: int = 0, shared_experts: int = 0,
                dense_layers: int = 0, capacity_factor: float = 0.0, head_dim: int = 0,
                expert_bias: bool = False, router_bias: bool = False, q_lora: int = 0, kv_lora: int = 0,
                qk_nope: int = 0, qk_rope: int = 0, v_head: int = 0, mtp_layers: int = 0, window: int = 0,
                window_layers: int = 0, sinks: bool = False, activation_clamp: float = 0.0,
                rope_mscale: float = 1.0, name: str | None = None) -> ModelSpec:
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
    if experts:   # an MoE layer's MLP: the router, routed and shared experts instead of the dense MLP
        ef, g = expert_ffn or f, (2 if gated_mlp else 1)
        moe_mlp = (hidden * experts + (experts + shared_experts) * (g + 1) * hidden * ef
                   + (experts if router_bias else 0) + (experts * (g * ef + hidden) if expert_bias else 0))
        moe_extra = (layers - dense_layers) * (moe_mlp - mlp)
    if mtp_layers:
        moe_extra += mtp_layers * mtp_params(hidden, norm_params, per_layer - mlp + moe_mlp)
    params = (layers * per_layer + moe_extra + vocab * hidden * (1 if tied_embeddings else 2)
              + (seq_len * hidden if position == "learned" else 0) + norm_params)
    return ModelSpec(name or f"transformer {params / 1e9:.1f}B", params, layers, hidden, seq_len=seq_len,
                     heads=heads, vocab=vocab, kind="gpt", kv_heads=kv if kv != heads else 0, ffn_hidden=f,
                     gated_mlp=gated_mlp, tied_embeddings=tied_embeddings, norm=norm, position=position,
                     dropout=dropout, experts=experts, top_k=top_k, expert_ffn=expert_ffn if experts else 0,
                     shared_experts=shared_experts, dense_layers=dense_layers if experts else 0,
                     capacity_factor=capacity_factor, head_size=head_dim if head_dim != hidden // heads else 0,
                     q_lora=q_lora if kv_lora else 0, kv_lora=kv_lora, qk_nope=qk_nope if kv_lora else 0,
                     qk_rope=qk_rope if kv_lora else 0, v_head=v_head if kv_lora else 0, mtp_layers=mtp_layers,
                     window=window, window_layers=window_layers if window else 0, sinks=sinks,
                     expert_bias=expert_bias and bool(experts), activation_clamp=activation_clamp,
                     rope_mscale=rope_mscale)


def llama(layers: int, hidden: int, heads: int, kv_heads: int, ffn_hidden: int, seq_len: int = 4096,
          vocab: int = 32000, name: str | None = None, **extra) -> ModelSpec:
    """A Llama-family decoder (Touvron et al. 2023; Llama 3: Dubey et al. 2024): grouped-query attention,
    SwiGLU MLP of width ``ffn_hidden``, RMSNorm, rotary positions, untied embeddings, no biases, no dropout.
    ``extra``: :func:`transformer`'s other arguments — experts (Mixtral is a Llama with 8 experts, top-2),
    attention variants (DeepSeek-V3's latent attention, GPT-OSS's windows and sinks), or a default overridden
    (GPT-OSS has biases)."""
    shape = dict(kv_heads=kv_heads, ffn_hidden=ffn_hidden, gated_mlp=True, tied_embeddings=False, norm="rmsnorm",
                 position="rope", bias=False, dropout=False)
    return transformer(layers, hidden, heads, seq_len, vocab, name=name, **{**shape, **extra})


# Llama shapes from the model cards / torchtitan's model args (layers, hidden, heads, kv_heads, ffn, vocab, seq)
LLAMA_SIZES = {
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096),
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=13824, vocab=32000, seq_len=4096),
    "llama2-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000, seq_len=4096),
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, seq_len=8192),
    "llama3-405b": dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
                        seq_len=8192),
    # mixtures of experts with Llama-style layers, from their configs on the Hugging Face hub: Mixtral (Jiang et
    # al. 2024, mistralai/Mixtral-8x7B-v0.1, -8x22B-v0.1), DeepSeekMoE 16B (Dai et al. 2024,
    # deepseek-ai/deepseek-moe-16b-base: 64 fine-grained experts of 1408, 2 shared, top-6, first layer dense),
    # Qwen1.5-MoE-A2.7B (Qwen/Qwen1.5-MoE-A2.7B: 60 experts of 1408, top-4, one shared of 5632 = 4 x 1408)
    "mixtral-8x7b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                         seq_len=4096, experts=8, top_k=2),
    "mixtral-8x22b": dict(layers=56, hidden=6144, heads=48, kv_heads=8, ffn_hidden=16384, vocab=32768,
                          seq_len=4096, experts=8, top_k=2),
    "deepseek-moe-16b": dict(layers=28, hidden=2048, heads=16, kv_heads=16, ffn_hidden=10944, vocab=102400,
                             seq_len=4096, experts=64, top_k=6, expert_ffn=1408, shared_experts=2, dense_layers=1),
    # Qwen3 MoE (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B configs): head_dim 128 (not hidden/heads), 128 experts
    "qwen3-30b-a3b": dict(layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=6144, vocab=151936,
                          seq_len=4096, experts=128, top_k=8, expert_ffn=768, head_dim=128),
    "qwen3-235b-a22b": dict(layers=94, hidden=4096, heads=64, kv_heads=4, ffn_hidden=12288, vocab=151936,
                            seq_len=4096, experts=128, top_k=8, expert_ffn=1536, head_dim=128),
    # DeepSeek-V3 (DeepSeek-AI 2024, technical report §4.2; deepseek-ai/DeepSeek-V3 config.json): 61 layers, the
    # first 3 dense (width 18432), then 1 shared + 256 routed experts of 2048, top-8, a router bias (§2.1.2);
    # multi-head latent attention with 128 heads, q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128; one
    # multi-token-prediction module (§2.2); vocabulary 129280
    "deepseek-v3": dict(layers=61, hidden=7168, heads=128, kv_heads=128, ffn_hidden=18432, vocab=129280,
                        seq_len=4096, experts=256, top_k=8, expert_ffn=2048, shared_experts=1, dense_layers=3,
                        router_bias=True, q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128,
                        mtp_layers=1),
    # GPT-OSS-120B (OpenAI 2025, gpt-oss-120b model card §2; openai/gpt-oss-120b config.json): 36 layers, hidden
    # 2880, 64 query heads of 64, 8 KV heads, biases in attention, router and experts, 128 experts of 2880, top-4;
    # layers alternate a 128-token banded window and dense attention (18 each), a learned sink per head;
    # vocabulary 201088 (o200k_harmony); the gated activation's inputs clamped at 7 (config.json "swiglu_limit": 7.0;
    # Megatron-Bridge's GPTOSSProvider, activation_func_clamp_value=7.0); YaRN RoPE with factor 32 and no mscale
    # given, so Megatron-Core's concentration factor 0.1·ln 32 + 1 (``_yarn_get_concentration_factor``; config.json
    # "rope_scaling": yarn, factor 32; the provider's yarn_rotary_scaling_factor=32.0, yarn_mscale=None)
    "gpt-oss-120b": dict(layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088, seq_len=4096,
                         experts=128, top_k=4, expert_ffn=2880, head_dim=64, bias=True, expert_bias=True,
                         router_bias=True, window=128, window_layers=18, sinks=True, activation_clamp=7.0,
                         rope_mscale=0.1 * math.log(32) + 1),
    "qwen1.5-moe-a2.7b": dict(layers=24, hidden=2048, heads=16, kv_heads=16, ffn_hidden=5632, vocab=151936,
                              seq_len=4096, experts=60, top_k=4, expert_ffn=1408, shared_experts=4),
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
