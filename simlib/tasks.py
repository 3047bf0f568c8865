"""Tasks for :func:`simlib.train.train`: what to learn, as small dataclasses.

``RegressionTask`` is the lessons' MLP regression (``y = tanh(x W) + noise``, ``simlib.models``) made a
task: a fixed training set walked through in global batches, a held-out set for the eval loss. The GPT
project's task is :class:`simlib.projects.gpt.GPTTask`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .models import MLP


@dataclass
class RegressionTask:
    """The lessons' MLP on synthetic regression data; global batch ``global_batch`` of ``num_samples``."""

    name: str = "mlp_regression"
    width: int = 64
    depth: int = 3
    global_batch: int = 64
    num_samples: int = 4096
    eval_samples: int = 512
    seed: int = 0
    dropout: float = 0.0  # on the input features while training: the run then draws random numbers every step

    def __post_init__(self):
        from .models import make_regression

        x, y = make_regression(self.num_samples + self.eval_samples, self.width, seed=self.seed + 1)
        self._x, self._y = x[: self.num_samples], y[: self.num_samples]
        self._eval = x[self.num_samples :], y[self.num_samples :]

    @property
    def flops_per_sample(self) -> float:  # forward + backward: 6 FLOPs per weight per sample
        return 6 * (self.depth * self.width * self.width + self.width)

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return DropoutMLP(self.width, self.depth, self.dropout) if self.dropout else MLP(self.width, self.depth)

    def batch(self, step: int, part: int = 0, parts: int = 1):
        """Global batch ``step``: consecutive rows of the training set, wrapping around (same for every plan);
        ``part`` of ``parts``: only that contiguous block of it (a DP rank reads its share, not the whole batch)."""
        if self.global_batch % parts or not 0 <= part < parts:
            raise ValueError(
                f"global batch {self.global_batch} does not split into {parts} equal parts (part {part} asked)"
            )
        size = self.global_batch // parts
        idx = (torch.arange(part * size, (part + 1) * size) + step * self.global_batch) % self.num_samples
        return self._x[idx], self._y[idx]

    def loss(self, output, target):
        return nn.functional.mse_loss(output, target)

    def evaluate(self, model) -> dict:
        device = next(model.parameters()).device
        x, y = self._eval
        return {"eval_loss": float(self.loss(model(x.to(device)), y.to(device)))}

    def blocks(self, model) -> list[nn.Module]:
        """Linear + ReLU pairs, as modules the model really calls: ``model.net`` is regrouped in place (the same
        parameters), so that recomputing a block recomputes what the forward runs."""
        from .parallel.pipeline import blocks_of

        if not all(isinstance(m, nn.Sequential) for m in model.net):
            model.net = nn.Sequential(*blocks_of(model.net))
        return list(model.net)

    def pipeline_stages(self, model, pp_rank: int, pp_size: int) -> list[nn.Module]:
        from .parallel.pipeline import build_stages

        return build_stages(model.net, pp_rank, pp_size)

    def check_plan(self, plan) -> None:
        blocks = self.depth + 1
        if plan.pp > blocks:
            raise ValueError(f"the MLP has {blocks} blocks (depth {self.depth} + head): use pp <= {blocks}")


class DropoutMLP(MLP):
    """The MLP with dropout on its input features while training (so every step draws random numbers)."""

    def __init__(self, width: int, depth: int, p: float):
        super().__init__(width, depth)
        self.p = p

    def forward(self, x):
        return self.net(nn.functional.dropout(x, self.p, self.training))
