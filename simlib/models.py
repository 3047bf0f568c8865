"""Small models and generated data for the lessons (nothing downloads at run time)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """``depth`` Linear+ReLU blocks of ``width`` features, then a Linear head to ``out_features``.

    The default 4 x 1024 MLP has 4.2 M parameters (16.8 MB of fp32 gradients): big enough that a step
    is compute-bound on a CPU core at batch sizes of a few hundred, small enough to run in seconds.
    """

    def __init__(self, width: int = 1024, depth: int = 4, in_features: int | None = None, out_features: int = 1):
        super().__init__()
        in_features = width if in_features is None else in_features
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(in_features if i == 0 else width, width), nn.ReLU()]
        layers.append(nn.Linear(width if depth else in_features, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_features) -> (B, out_features)
        return self.net(x)


def make_regression(num_samples: int, in_features: int, out_features: int = 1, seed: int = 0, noise: float = 0.01):
    """A synthetic regression set: y = tanh(x @ W) + noise, the same for every rank given ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_features, generator=g)
    w = torch.randn(in_features, out_features, generator=g) / in_features**0.5
    y = torch.tanh(x @ w) + noise * torch.randn(num_samples, out_features, generator=g)
    return x, y


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``rank::world_size`` would interleave; lessons use contiguous shards: equal blocks by rank."""
    if x.shape[0] % world_size:
        raise ValueError(f"{x.shape[0]} samples do not split into {world_size} equal shards")
    n = x.shape[0] // world_size
    return x[rank * n : (rank + 1) * n]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- model parallelism (lessons 04-05) ----
class FeedForward(nn.Module):
    """The transformer MLP block: Linear(hidden -> ffn), GELU, Linear(ffn -> hidden) (Vaswani et al. 2017)."""

    def __init__(self, hidden: int = 256, ffn: int | None = None):
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, hidden) -> (B, S, hidden)
        return self.fc2(self.act(self.fc1(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection (as in GPT-2 and Megatron-LM)."""

    def __init__(self, hidden: int = 256, num_heads: int = 8, causal: bool = True):
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden {hidden} is not a multiple of num_heads {num_heads}")
        self.hidden, self.num_heads, self.causal = hidden, num_heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)  # rows: all q, then all k, then all v
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, hidden) -> (B, S, hidden)
        return self.out(attend(self.qkv(x), self.num_heads, self.causal))


class TransformerBlock(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x)). (B, T, H) -> (B, T, H).

    ``make_mlp``: builds the MLP (called after the layer norms, so parameters are drawn in the same order whatever
    it builds); default :class:`FeedForward` of width ``ffn``. simlib's GPT block (the MoE variant passes its
    experts) and the simulator's calibration of a block's host cost (``simlib.sim.kernels.block_op_time``)."""

    def __init__(self, hidden: int, num_heads: int, ffn: int | None = None, make_mlp=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, num_heads, causal=True)  # fused qkv, out projection
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = make_mlp() if make_mlp is not None else FeedForward(hidden, ffn)  # fc1, GELU, fc2

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def attend(qkv: torch.Tensor, num_heads: int, causal: bool = True) -> torch.Tensor:
    """Scaled dot-product attention from fused q|k|v features (B, S, 3·h·d) -> (B, S, h·d), heads independent."""
    b, s, three_hd = qkv.shape
    q, k, v = qkv.view(b, s, 3, num_heads, three_hd // (3 * num_heads)).permute(2, 0, 3, 1, 4)  # (B, h, S, d)
    y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(b, s, -1)


class BlockMLP(nn.Module):
    """``depth`` residual blocks x + W2·relu(W1·x) (width -> ffn -> width) between an input and an output Linear.

    The memory lesson's model: repeated blocks (``model.blocks``) for ZeRO-3's per-block sharding and for
    activation checkpoints, and activations that grow with the batch while the states do not.
    """

    def __init__(
        self,
        width: int = 256,
        depth: int = 4,
        ffn: int | None = None,
        in_features: int | None = None,
        out_features: int = 1,
    ):
        super().__init__()
        ffn = ffn or 4 * width
        self.embed = nn.Linear(in_features or width, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, ffn), nn.ReLU(), nn.Linear(ffn, width)) for _ in range(depth)
        )
        self.head = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_features) -> (B, out_features)
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)
