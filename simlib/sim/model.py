"""What a model asks of the machine: parameters, GEMMs (hence FLOPs) and activation bytes per sample.

Two sources: :func:`from_module` counts a torch module's Linear layers (the course's MLPs),
:func:`~simlib.sim.model_zoo.gpt` uses the transformer formulas. For GPT the forward GEMMs per layer are QKV (h→3h), attention scores and values
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

from dataclasses import dataclass

from .attention import mla_gemms


@dataclass(frozen=True)
class ModelSpec:
    """A model as the cost model sees it. ``linears``: (in, out) of each Linear of an MLP, in forward order."""

    name: str
    params: int
    layers: int  # repeated blocks: pipeline stages split these
    hidden: int
    seq_len: int = 1  # tokens per sample (1 for an MLP)
    heads: int = 1
    vocab: int = 0
    linears: tuple = ()  # MLP only
    kind: str = "mlp"  # "mlp" | "gpt"
    activation_width: int = 0  # MLP: sum of widths of element-wise (ReLU) outputs per sample
    param_numels: tuple = ()  # MLP: numel of each parameter in registration order (for bucket plans)
    rows: tuple = ()  # MLP: GEMM rows per sample of each entry of ``linears`` (default 1 each; a
    # convolution as im2col GEMM has one row per output pixel)
    kv_heads: int = 0  # GPT: key/value heads (grouped-query attention); 0: as many as ``heads``
    ffn_hidden: int = 0  # GPT: MLP inner width f; 0: 4·hidden
    gated_mlp: bool = False  # GPT: SwiGLU (gate and up projections h→f, then f→h) instead of h→4h→h with GeLU
    tied_embeddings: bool = True  # GPT: the logits reuse the input embedding table
    norm: str = "layernorm"  # GPT: "layernorm" | "rmsnorm"
    position: str = "learned"  # GPT: "learned" (a table of s×h) | "rope" | "alibi" (no parameters)
    dropout: bool = True  # GPT: dropout after attention and the residual branches (Megatron's GPT: yes)
    # mixture of experts (GPT only; 0 experts: a dense model). Switch Transformer (Fedus et al. 2021), Mixtral
    # (Jiang et al. 2024), DeepSeekMoE's fine-grained and shared experts (Dai et al. 2024)
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 1  # experts each token is routed to
    expert_ffn: int = 0  # inner width of one expert (0: ffn); fine-grained experts are narrower
    shared_experts: int = 0  # experts every token goes through (DeepSeekMoE), each of width expert_ffn
    dense_layers: int = 0  # leading layers with a dense MLP instead (DeepSeek-V3: the first 3)
    capacity_factor: float = 0.0  # tokens an expert takes, over the even share (0: dropless, no cap)
    head_size: int = 0  # GPT: head dimension when it is not hidden / heads (Qwen3: 128); 0: hidden/heads
    # attention variants (simlib.sim.attention): multi-head latent attention when kv_lora > 0 (DeepSeek-V2/V3),
    # multi-token-prediction modules, sliding windows on some layers and attention sinks (GPT-OSS)
    q_lora: int = 0  # MLA: query latent width (DeepSeek-V3: 1536)
    kv_lora: int = 0  # MLA: key/value latent width (512); 0: not MLA
    qk_nope: int = 0  # MLA: per-head query/key dimensions without rotary (128)
    qk_rope: int = 0  # MLA: per-head rotary query/key dimensions, the key's shared by all heads (64)
    v_head: int = 0  # MLA: per-head value dimension (128)
    mtp_layers: int = 0  # multi-token-prediction modules after the last layer (DeepSeek-V3: 1)
    window: int = 0  # sliding-window width in tokens on ``window_layers`` of the layers (0: none)
    window_layers: int = 0  # how many layers use the window (GPT-OSS: every second one, 18 of 36)
    sinks: bool = False  # a learned attention-sink logit per head in every layer (GPT-OSS)
    expert_bias: bool = False  # biases in the routed experts' projections (GPT-OSS; priced in cluster_ops)
    activation_clamp: float = 0.0  # the gated activation's inputs clamped to this bound first (GPT-OSS: 7; 0: none)
    rope_mscale: float = 1.0  # YaRN's concentration factor on RoPE's cos and sin (GPT-OSS: 0.1·ln 32 + 1; layer.py)

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
                raise ValueError(
                    f"an MoE GPT needs experts >= 1 and 1 <= top_k <= experts, got experts="
                    f"{self.experts}, top_k={self.top_k}"
                )
            if not 0 <= self.dense_layers < self.layers or self.capacity_factor < 0 or self.shared_experts < 0:
                raise ValueError(
                    f"dense_layers must be in [0, layers), capacity_factor and shared_experts >= 0; "
                    f"got {self.dense_layers}, {self.capacity_factor}, {self.shared_experts}"
                )
        if self.kv_lora and not (self.q_lora > 0 and self.qk_nope > 0 and self.qk_rope > 0 and self.v_head > 0):
            raise ValueError(
                f"multi-head latent attention needs q_lora, qk_nope, qk_rope and v_head > 0, got "
                f"{self.q_lora}, {self.qk_nope}, {self.qk_rope}, {self.v_head}"
            )
        if self.activation_clamp < 0 or self.rope_mscale <= 0:
            raise ValueError(
                f"activation_clamp must be >= 0 (0: no clamp) and rope_mscale > 0, got "
                f"{self.activation_clamp}, {self.rope_mscale}"
            )
        if self.window < 0 or not 0 <= self.window_layers <= self.layers or self.mtp_layers < 0:
            raise ValueError(
                f"window >= 0, window_layers in [0, layers] and mtp_layers >= 0, got {self.window}, "
                f"{self.window_layers}, {self.mtp_layers}"
            )

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
        blocks = self.moe_layers + (self.mtp_layers if self.experts else 0)  # an MTP block is an MoE block too
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
            gemms.append((t, h, self.vocab // tp, 1))  # logits
        if layers == self.layers and self.mtp_layers:  # multi-token prediction (attention.py)
            n = self.mtp_layers
            gemms += [
                (t, 2 * h, h, n),
                *self._block_gemms(micro_batch, tp, n, n if self.experts else 0, 0),
                *([(t, h, self.vocab // tp, n)] if self.vocab else []),
            ]
        return gemms

    def _block_gemms(self, micro_batch: int, tp: int, layers: int, moe: int, windowed: int):
        """Forward GEMMs of ``layers`` transformer blocks, ``moe`` of them with experts and ``windowed`` of them
        with the sliding window (each query against ``window`` keys instead of the whole sequence)."""
        t, h, s, a = micro_batch * self.seq_len, self.hidden, self.seq_len, self.heads
        heads_here = max(a // tp, 1)
        if self.mla:
            gemms = [(m, k, n, layers) for _, m, k, n in mla_gemms(self, t, tp)]  # latent down/up projections
        else:
            gemms = [(t, h, self.qkv_width // tp, layers)]  # QKV, column-parallel
        d_qk = self.qk_nope + self.qk_rope if self.mla else self.head_dim
        d_v = self.v_head if self.mla else self.head_dim
        windowed = windowed if self.window and self.window < s else 0
        for n, keys in ((layers - windowed, s), (windowed, self.window)):
            if n:
                gemms += [
                    (s, d_qk, keys, micro_batch * heads_here * n),  # scores Q·Kᵀ per head
                    (s, keys, d_v, micro_batch * heads_here * n),
                ]  # scores · V
        gemms.append((t, self.q_width // tp, h, layers))  # output projection, row-parallel
        if layers - moe:
            gemms += self.mlp_gemms(t, tp, layers - moe, False)  # MLP up (and gate), down
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
    return ModelSpec(
        name or type(module).__name__,
        int(params),
        len(linears),
        max(o for _, o in linears),
        linears=linears,
        kind="mlp",
        activation_width=relu_width,
        param_numels=tuple(p.numel() for p in module.parameters() if p.requires_grad),
    )
