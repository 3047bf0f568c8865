"""What a model asks of the machine: parameters, GEMMs (hence FLOPs) and activation bytes per sample.

Two sources: :func:`from_module` counts a torch module's Linear layers (the course's MLPs), :func:`gpt` uses the
transformer formulas. For GPT the forward GEMMs per layer are QKV (h→3h), attention scores and values
(2·s·h per token each), the output projection (h→h) and the MLP (h→4h→h), plus the logits (h→V) once:
forward+backward FLOPs per iteration = 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) (Narayanan et al. 2021, eq. 3),
i.e. ≈ 6·N FLOPs per token plus the attention term (Kaplan et al. 2020).
"""
from __future__ import annotations

from dataclasses import dataclass


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

    def __post_init__(self):
        for name in ("params", "layers", "hidden", "seq_len", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.kind not in ("mlp", "gpt"):
            raise ValueError(f"kind must be 'mlp' or 'gpt', got {self.kind!r}")

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def forward_gemms(self, micro_batch: int, tp: int = 1, layers: int | None = None):
        """GEMMs of one forward pass over ``layers`` blocks as (m, k, n, count); TP splits them Megatron-style."""
        if micro_batch < 1 or tp < 1:
            raise ValueError(f"micro_batch and tp must be >= 1, got {micro_batch}, {tp}")
        layers = self.layers if layers is None else layers
        if self.kind == "mlp":
            rows = self.rows or (1,) * len(self.linears)
            per_layer = [(micro_batch * r, i, o, 1) for (i, o), r in zip(self.linears, rows)]
            return per_layer if layers == self.layers else per_layer[:layers]
        t, h, s, a = micro_batch * self.seq_len, self.hidden, self.seq_len, self.heads
        heads_here = max(a // tp, 1)
        gemms = [(t, h, 3 * h // tp, layers),                            # QKV, column-parallel
                 (s, h // a, s, micro_batch * heads_here * layers),      # scores Q·Kᵀ per head
                 (s, s, h // a, micro_batch * heads_here * layers),      # scores · V
                 (t, h // tp, h, layers),                                # output projection, row-parallel
                 (t, h, 4 * h // tp, layers),                            # MLP up
                 (t, 4 * h // tp, h, layers)]                            # MLP down
        if layers == self.layers and self.vocab:
            gemms.append((t, h, self.vocab // tp, 1))                    # logits
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
