"""Small models and generated data for the lessons (nothing downloads at run time)."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """``depth`` Linear+ReLU blocks of ``width`` features, then a Linear head to ``out_features``.

    The default 4 x 1024 MLP has 4.2 M parameters (16.8 MB of fp32 gradients): big enough that a step
    is compute-bound on a CPU core at batch sizes of a few hundred, small enough to run in seconds.
    """

    def __init__(self, width: int = 1024, depth: int = 4, in_features: int | None = None,
                 out_features: int = 1):
        super().__init__()
        in_features = width if in_features is None else in_features
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(in_features if i == 0 else width, width), nn.ReLU()]
        layers.append(nn.Linear(width if depth else in_features, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_features) -> (B, out_features)
        return self.net(x)


def make_regression(num_samples: int, in_features: int, out_features: int = 1, seed: int = 0,
                    noise: float = 0.01):
    """A synthetic regression set: y = tanh(x @ W) + noise, the same for every rank given ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_features, generator=g)
    w = torch.randn(in_features, out_features, generator=g) / in_features ** 0.5
    y = torch.tanh(x @ w) + noise * torch.randn(num_samples, out_features, generator=g)
    return x, y


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``rank::world_size`` would interleave; lessons use contiguous shards: equal blocks by rank."""
    if x.shape[0] % world_size:
        raise ValueError(f"{x.shape[0]} samples do not split into {world_size} equal shards")
    n = x.shape[0] // world_size
    return x[rank * n:(rank + 1) * n]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
