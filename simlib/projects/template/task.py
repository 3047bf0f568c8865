"""The task: what to learn (the model, the global batches, the loss, the held-out evaluation). The loop
(``simlib.train``) and the plan (``simlib.plan.Plan``: dp, tp, pp, ...) do the rest; the task never knows the plan."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_SPLITS = {}  # (holdout, seed) -> the split, made once per process


def diabetes_split(holdout: float = 0.25, seed: int = 0):
    """(x_train, y_train, x_test, y_test) as float32 tensors: a fixed split, the features and the target
    standardised by the training rows' mean and spread (so a loss of 1 is what predicting the mean scores)."""
    if (holdout, seed) not in _SPLITS:
        _SPLITS[holdout, seed] = _split(holdout, seed)
    return _SPLITS[holdout, seed]


def _split(holdout, seed):
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=holdout, random_state=seed)
    mu, sd = y_tr.mean(), y_tr.std()
    x_mu, x_sd = x_tr.mean(0), x_tr.std(0)

    def as_t(a):
        return torch.as_tensor(a, dtype=torch.float32)

    return (
        as_t((x_tr - x_mu) / x_sd),
        as_t((y_tr - mu) / sd).unsqueeze(1),
        as_t((x_te - x_mu) / x_sd),
        as_t((y_te - mu) / sd).unsqueeze(1),
    )


@dataclass
class DiabetesTask:
    name: str = "diabetes"
    global_batch: int = 64  # patients per step (drawn with replacement from the training rows)
    hidden: int = 32  # width of the MLP's two hidden layers
    holdout: float = 0.25  # share of the patients kept for evaluation
    seed: int = 0  # the weights' and the batches' seed

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)  # the same weights on every rank, whatever the world size
        return nn.Sequential(
            nn.Linear(10, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, 1),
        )

    def batch(self, step: int):
        """The GLOBAL batch of ``step``: a pure function of it, identical for every plan (the loop splits it)."""
        x, y, _, _ = diabetes_split(self.holdout)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows = torch.randint(0, len(x), (self.global_batch,), generator=g)
        return x[rows], y[rows]

    def loss(self, output, target):
        return nn.functional.mse_loss(output, target)  # the mean over the samples given

    def evaluate(self, model) -> dict:
        _, _, x, y = diabetes_split(self.holdout)
        with torch.no_grad():
            return {"eval_loss": float(self.loss(model(x), y))}

    def sim_spec(self):
        """The model as ``simlib plan`` and the dry run price it: its Linear layers, counted."""
        from simlib.sim import from_module

        return from_module(self.build_model(), f"MLP {self.hidden}x2 on the diabetes data")
