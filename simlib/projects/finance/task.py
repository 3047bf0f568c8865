"""Project 3, financial modelling: deep hedging of an option on Monte-Carlo paths, tested on real prices.

Data: the daily S&P 500 series (1999-2018, 5,031 days) that ships inside the ``arch`` package
(``arch.data.sp500``; arch is NCSA-licensed and on PyPI, so nothing downloads at run time; the file itself
carries no separate licence - it is Yahoo! Finance's public index history, which we read from the installed
package and never copy into this repository). Honest split by time: the volatility that calibrates the
simulator is estimated on the **training years** (to the end of ``train_end``) only; the **test** is hedging
real 30-day windows of the later years, which the model never sees (no look-ahead).

Model (Buehler et al. 2019, "Deep hedging"): a small network decides, each day, how many units of the index
to hold against a short at-the-money call, from (log-moneyness, time to maturity, yesterday's holding).
With proportional transaction costs the Black-Scholes delta is no longer optimal, so there is something to
learn. Output of the model: premium + trading gains - costs per path; the loss is the mean squared hedging
error against the payoff. The baseline beside it: the Black-Scholes delta with the same historical volatility.

Data-parallel Monte Carlo: every path block is simulated from its own generator seeded by
``(seed, step, block)`` (see :mod:`simlib.projects.seeding`), so each rank generates only its own paths and
the global batch is the same whatever the world size. ``paths_seeding="same_seed"`` plants the bug.

A learner's own code can run at two places of this training (the project's ``PIECES``, :mod:`.pieces`): ``paths``
(called by :meth:`HedgingTask.batch` for this rank's paths) and ``grad_average`` (called after each backward by the
wrapper :meth:`HedgingTask.data_parallel` installs); without them the course's own code runs, the same run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from ... import guards
from ... import pieces as pieces_lib
from .. import check_data_device, data_device, positive_int
from ..seeding import generator, mix
from .pieces import gbm_paths

__all__ = [
    "HedgingTask",
    "HedgeNet",
    "load_sp500",
    "calibrate",
    "bs_call_price",
    "bs_delta",
    "real_windows",
    "hedge_pnl",
    "SEEDINGS",
]

SEEDINGS = ("per_block", "same_seed")
TRADING_DAYS = 252


@lru_cache(maxsize=1)
def load_sp500():
    """The adjusted daily close of the S&P 500 from ``arch.data.sp500`` (pandas Series, DatetimeIndex)."""
    try:
        from arch.data import sp500
    except ImportError as e:  # pragma: no cover - arch is a dependency
        raise ImportError(
            "the finance project reads the S&P 500 series bundled with the `arch` package: pip install arch"
        ) from e
    return sp500.load()["Adj Close"].dropna()


def calibrate(train_end: str = "2012-12-31") -> dict:
    """Annualised volatility of daily log returns up to ``train_end``: historical, and GARCH(1,1)'s long run."""
    prices = load_sp500()
    r = np.log(prices[:train_end]).diff().dropna()
    out = {"train_days": int(len(r)), "hist_vol": float(r.std() * math.sqrt(TRADING_DAYS))}
    try:
        from arch import arch_model

        fit = arch_model(100 * r, vol="GARCH", p=1, q=1).fit(disp="off")
        w, a, b = (float(fit.params[k]) for k in ("omega", "alpha[1]", "beta[1]"))
        out["garch_long_run_vol"] = math.sqrt(w / (1 - a - b) * TRADING_DAYS) / 100 if a + b < 1 else float("nan")
    except Exception:  # the GARCH figure is for comparison only
        out["garch_long_run_vol"] = float("nan")
    return out


def real_windows(days: int, start: str = "2013-01-01", end: str | None = None, stride: int | None = None):
    """Real price windows of ``days`` trading days from the test years, each normalised to start at 1."""
    prices = load_sp500()[start:end].to_numpy()
    stride = stride or days
    rows = [prices[i : i + days + 1] / prices[i] for i in range(0, len(prices) - days, stride)]
    return torch.tensor(np.stack(rows), dtype=torch.float32)


def _norm_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def bs_call_price(s, k, tau, vol):
    """Black-Scholes call price (zero rates); ``tau`` in years."""
    s, tau = torch.as_tensor(s, dtype=torch.float32), torch.as_tensor(tau, dtype=torch.float32)
    sd = vol * torch.sqrt(tau.clamp_min(1e-12))
    d1 = (torch.log(s / k) + 0.5 * sd**2) / sd
    return s * _norm_cdf(d1) - k * _norm_cdf(d1 - sd)


def bs_delta(s, k, tau, vol):
    sd = vol * torch.sqrt(torch.as_tensor(tau, dtype=torch.float32).clamp_min(1e-12))
    return _norm_cdf((torch.log(s / k) + 0.5 * sd**2) / sd)


def hedge_pnl(paths, holdings, premium, strike, cost):
    """premium + sum_t h_t (S_{t+1} - S_t) - cost * sum_t |h_t - h_{t-1}| S_t  (h_{-1} = 0, h_T = 0: unwind)."""
    gains = (holdings * (paths[:, 1:] - paths[:, :-1])).sum(1)
    prev = torch.cat([torch.zeros_like(holdings[:, :1]), holdings, torch.zeros_like(holdings[:, :1])], 1)
    trade_at = torch.cat([paths[:, :-1], paths[:, -1:]], 1)
    costs = cost * ((prev[:, 1:] - prev[:, :-1]).abs() * trade_at).sum(1)
    return premium + gains - costs


class HedgeNet(nn.Module):
    """Each day: holding = Black-Scholes delta + f(log(S/K), time to maturity, BS delta, yesterday's holding).

    The network learns a *correction* to the textbook hedge (its last layer starts at zero, so an untrained
    HedgeNet is the Black-Scholes hedge); with transaction costs the best correction trades less.
    Output: the hedged value per path (premium + gains - costs); the premium is learned too.
    """

    def __init__(
        self, days: int, vol: float, hidden: int = 32, depth: int = 2, strike: float = 1.0, cost: float = 0.002
    ):
        super().__init__()
        layers, width = [], 4
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        head = nn.Linear(width, 1)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.net = nn.Sequential(*layers, head)
        self.days, self.strike, self.cost, self.vol = days, strike, cost, vol
        # the premium starts at the Black-Scholes price and is learned with the hedge
        self.premium = nn.Parameter(bs_call_price(1.0, strike, days / TRADING_DAYS, vol).reshape(1))

    def holdings(self, paths):  # (B, days+1) -> (B, days)
        b = paths.shape[0]
        h = torch.zeros(b, 1, dtype=paths.dtype, device=paths.device)
        out = []
        for t in range(self.days):
            tau = (self.days - t) / TRADING_DAYS
            s = paths[:, t : t + 1]
            delta = bs_delta(s, self.strike, tau, self.vol).to(s.dtype)
            feats = torch.cat([torch.log(s / self.strike) * 10, torch.full_like(h, tau * 10), delta, h], 1)
            h = delta + self.net(feats)
            out.append(h)
        return torch.cat(out, 1)

    def forward(self, paths):  # (B, days+1) -> (B,) premium + gains - costs
        return hedge_pnl(paths, self.holdings(paths), self.premium, self.strike, self.cost)


@dataclass
class HedgingTask:
    """The finance project as a ``Task`` for ``simlib.train``: batch = Monte-Carlo GBM paths, y = payoff."""

    global_batch: int = 512  # paths per optimizer step over all ranks
    days: int = 30  # hedging horizon (trading days); one rebalance per day
    block: int = 32  # paths per seeded block: a rank simulates whole blocks
    hidden: int = 32
    depth: int = 2
    cost: float = 0.002  # proportional transaction cost (20 basis points per unit traded)
    train_end: str = "2012-12-31"  # calibration uses prices up to here; the test years start after
    paths_seeding: str = "per_block"  # or "same_seed": every rank draws from (seed, step) - the bug
    paths_on: str = "cpu"  # where training paths are drawn: "cpu", or "cuda" (this rank's GPU when there
    # is one: the GPU size; a CUDA generator per block, so other numbers)
    seed: int = 0
    name: str = field(default="finance", init=False)

    def __post_init__(self):
        guards.check_task(self)  # every field, one line naming a wrong one
        for key in ("global_batch", "days", "block", "hidden", "depth"):
            positive_int(key, getattr(self, key))
        if self.global_batch % self.block:
            raise ValueError(f"global_batch {self.global_batch} must be a multiple of block {self.block}")
        if not 0 <= self.cost < 0.1:
            raise ValueError(f"cost is a fraction per unit traded in [0, 0.1), got {self.cost!r}")
        check_data_device("paths_on", self.paths_on)
        if self.paths_seeding not in SEEDINGS:
            raise ValueError(f"paths_seeding must be one of {SEEDINGS}, got {self.paths_seeding!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    @property
    def vol(self) -> float:
        """Annualised historical volatility of the training years (no look-ahead)."""
        return _hist_vol(self.train_end)

    @property
    def test_start(self) -> str:
        return str(np.datetime64(self.train_end) + np.timedelta64(1, "D"))

    def simulate(self, n: int, keys, device=None) -> torch.Tensor:
        """``n`` GBM paths (n, days+1) from S_0 = 1 with the calibrated vol and zero drift, from ``keys``' stream,
        on ``device`` (default: where ``paths_on`` says; a CUDA generator seeded from the same keys there)."""
        dev = torch.device(device) if device is not None else data_device(self.paths_on)
        gen = generator(*keys) if dev.type == "cpu" else torch.Generator(device=dev).manual_seed(mix(*keys))
        return gbm_paths(torch.randn(n, self.days, generator=gen, device=dev), self.vol)

    def batch(self, step: int, part: int = 0, parts: int = 1):
        """(paths, payoff) of part ``part`` of ``parts``: only this part's blocks are simulated."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not (isinstance(parts, int) and parts >= 1 and isinstance(part, int) and 0 <= part < parts):
            raise ValueError(f"need 0 <= part < parts, got part={part!r}, parts={parts!r}")
        blocks = self.global_batch // self.block
        if blocks % parts:
            raise ValueError(
                f"{blocks} blocks of {self.block} paths do not split into {parts} parts; use a "
                f"world size (x accumulation) dividing {blocks}, or a smaller block"
            )
        per = blocks // parts
        learner = pieces_lib.get("paths")  # the learner's piece in the run now going on (simlib.pieces), or None
        if learner is not None:
            paths = _learner_paths(learner, self, step, part, parts)
        elif self.paths_seeding == "same_seed":  # the bug: the rank's draw does not depend on the rank
            paths = self.simulate(per * self.block, (self.seed, 5, step))
        else:
            paths = torch.cat(
                [self.simulate(self.block, (self.seed, 5, step, b)) for b in range(part * per, (part + 1) * per)]
            )
        return paths, self.payoff(paths)

    def data_parallel(self, model, mode, bucket_cap_mb=25.0, timeline=None, group=None):
        """The data-parallel wrapper of this task's runs (``simlib.parallelize`` asks the task): with a learner's
        ``grad_average`` piece in the run, :class:`~.pieces.CountWeightedDataParallel` calling it after each
        backward; otherwise the plan's own wrapper (``mode``: ``Plan.dp_variant``)."""
        learner = pieces_lib.get("grad_average")
        if learner is None:
            from ...parallel import data as dp_lib

            return dp_lib.wrap(model, mode, bucket_cap_mb, timeline, group=group)
        from .pieces import CountWeightedDataParallel

        return CountWeightedDataParallel(model, learner, task=self, group=group, timeline=timeline)

    def payoff(self, paths):
        return (paths[:, -1] - 1.0).clamp_min(0)

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return HedgeNet(self.days, self.vol, self.hidden, self.depth, cost=self.cost)

    def loss(self, output, target):
        return torch.mean((output - target) ** 2)

    @property
    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs per path: the MLP's GEMMs once per day, x 3."""
        widths = [4] + [self.hidden] * self.depth + [1]
        return 3 * 2 * self.days * sum(a * b for a, b in zip(widths, widths[1:]))

    def sim_spec(self):
        """The model for ``simlib.sim``: the hedging MLP runs once per day of each path (``days`` rows)."""
        from ...sim import ModelSpec

        model = self.build_model()
        linears = tuple((m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear))
        return ModelSpec(
            f"HedgeNet {self.hidden}x{self.depth}, {self.days} days",
            sum(p.numel() for p in model.parameters()),
            len(linears),
            self.hidden,
            linears=linears,
            rows=(self.days,) * len(linears),
            activation_width=self.hidden * self.depth * self.days,
            param_numels=tuple(p.numel() for p in model.parameters()),
        )

    def test_paths(self, n: int = 4096) -> torch.Tensor:
        """Held-out simulated paths: a stream (seed, 7) that training never draws from."""
        return self.simulate(n, (self.seed, 7), device="cpu")  # the same held-out paths at every size

    def bs_hedge(self, paths) -> torch.Tensor:
        """The baseline: hedged value with Black-Scholes deltas at the training years' volatility."""
        tau = (self.days - torch.arange(self.days, dtype=torch.float32)) / TRADING_DAYS
        holdings = bs_delta(paths[:, :-1], 1.0, tau, self.vol)
        return hedge_pnl(paths, holdings, bs_call_price(1.0, 1.0, self.days / TRADING_DAYS, self.vol), 1.0, self.cost)

    @torch.no_grad()
    def evaluate_baseline(self) -> dict:
        """The Black-Scholes delta's RMS hedging error on the same held-out sets (computed, not assumed)."""
        out = {}
        for label, paths in (("sim", self.test_paths()), ("real", real_windows(self.days, self.test_start))):
            out[f"bs_rmse_{label}"] = float(torch.sqrt(self.loss(self.bs_hedge(paths), self.payoff(paths))))
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        """RMS hedging error (model and Black-Scholes delta) on held-out simulated paths and on the real test years."""
        net = model
        while hasattr(net, "module") and isinstance(net.module, nn.Module):
            net = net.module
        device = next(net.parameters()).device  # the held-out paths are made on the CPU: to the model's device
        out = {}
        for label, paths in (("sim", self.test_paths()), ("real", real_windows(self.days, self.test_start))):
            pay = self.payoff(paths)
            out[f"rmse_{label}"] = float(torch.sqrt(self.loss(net(paths.to(device)).float().cpu(), pay)))
            out[f"bs_rmse_{label}"] = float(torch.sqrt(self.loss(self.bs_hedge(paths), pay)))
        out["eval_loss"] = out["rmse_sim"] ** 2
        return out


def _learner_paths(piece, task, step: int, part: int, parts: int) -> torch.Tensor:
    """The learner's ``paths`` piece called for this rank, its answer checked: a tensor of (rows, days + 1)."""
    paths = piece(task, step, part, parts)
    if not isinstance(paths, torch.Tensor) or paths.dim() != 2 or paths.shape[1] != task.days + 1:
        raise ValueError(
            f"rank {part}, step {step}: your paths piece returned {getattr(paths, 'shape', type(paths).__name__)}; "
            f"it must return this rank's paths as a tensor of shape (paths of this rank, days + 1 = {task.days + 1})"
        )
    return paths.float()


@lru_cache(maxsize=8)
def _hist_vol(train_end: str) -> float:
    prices = load_sp500()[:train_end]
    if len(prices) < 60:
        raise ValueError(
            f"train_end {train_end!r} leaves {len(prices)} days to calibrate on; the series starts "
            f"{load_sp500().index[0].date()}"
        )
    return float(np.log(prices).diff().dropna().std() * math.sqrt(TRADING_DAYS))
