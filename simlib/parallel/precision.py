"""Mixed precision: compute in 16 bits, keep fp32 master weights; where the 16 bytes/parameter of Adam go.

Two layouts, both 16 bytes per parameter with Adam (Micikevicius et al. 2018; Rajbhandari et al. 2020 §3.1):

    autocast (torch.autocast)        fp32 weights 4 + fp32 gradients 4 + Adam m, v 8          = 16
                                     (each op casts its inputs to bf16 on the fly; the casts are transient)
    16-bit model + fp32 masters      bf16 weights 2 + bf16 gradients 2 + fp32 master 4 + m, v 8 = 16
    (MasterWeightsOptimizer)         ZeRO's "2 + 2 + 12": the 12 are optimizer states, sharded first

fp16 has 5 exponent bits: small gradients underflow to zero and large ones overflow to inf. Loss scaling
multiplies the loss by S before backward and the gradients by 1/S before the step; ``torch.amp.GradScaler``
skips a step whose gradients hold inf/NaN and halves S, and doubles S after a run of good steps.
bf16 has fp32's 8 exponent bits, so it needs no scaling (and CPUs run it under autocast).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

__all__ = ["DTYPES", "autocast", "MasterWeightsOptimizer", "bytes_per_parameter", "loss_scaling_demo"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None, "fp32": None}


def autocast(device, precision: str | None):
    """``torch.autocast`` for ``precision`` ("bf16" on CPU or GPU, "fp16" on GPU) or a no-op for None/"fp32"."""
    if precision not in DTYPES:
        raise ValueError(f"mixed_precision must be None, 'fp32', 'bf16' or 'fp16', got {precision!r}")
    device_type = torch.device(device).type
    if precision == "fp16" and device_type == "cpu":
        raise ValueError("fp16 autocast needs a GPU here (and loss scaling); on CPU use mixed_precision='bf16', "
                         "which has fp32's range and needs no scaling")
    return nullcontext() if DTYPES[precision] is None else torch.autocast(device_type, dtype=DTYPES[precision])


class MasterWeightsOptimizer(torch.optim.Optimizer):
    """Steps fp32 master copies of 16-bit parameters with ``inner_cls``, then copies them back rounded.

    The model holds bf16 weights and gradients (2 + 2 bytes); this object holds the fp32 masters (4) and the
    inner optimizer's states (Adam: 8). Without masters, small updates vanish: bf16 keeps 8 bits of mantissa,
    so w + 1e-4·w == w.
    """

    def __init__(self, params, inner_cls=torch.optim.AdamW, **kwargs):
        super().__init__(params, kwargs)
        self.masters = [p.detach().float().clone().requires_grad_(p.requires_grad)
                        for g in self.param_groups for p in g["params"]]
        it = iter(self.masters)
        self.inner = inner_cls([{**{k: v for k, v in g.items() if k != "params"},
                                     "params": [next(it) for _ in g["params"]]} for g in self.param_groups])

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        params = [p for g in self.param_groups for p in g["params"]]
        for glob, inner in zip(self.param_groups, self.inner.param_groups):  # schedulers write param_groups
            inner.update({k: v for k, v in glob.items() if k != "params"})
        for p, m in zip(params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()  # transient fp32 gradients (named, not counted)
        self.inner.step()
        for p, m in zip(params, self.masters):
            p.copy_(m)
            m.grad = None
        return loss

    def state_dict(self):
        return {"inner": self.inner.state_dict(), "masters": [m.detach().clone() for m in self.masters]}

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict["inner"])
        with torch.no_grad():
            for m, saved in zip(self.masters, state_dict["masters"]):
                m.copy_(saved)


def bytes_per_parameter(layout: str = "masters", optimizer: str = "adam") -> dict:
    """The textbook split: {"weights", "gradients", "optimizer"} bytes per parameter for a layout."""
    states = {"adam": 8, "sgd": 0, "sgd_momentum": 4}[optimizer]
    if layout == "fp32":
        return dict(weights=4, gradients=4, optimizer=states)
    if layout == "autocast":
        return dict(weights=4, gradients=4, optimizer=states)
    if layout == "masters":
        return dict(weights=2, gradients=2, optimizer=4 + states)
    raise ValueError(f"layout must be 'fp32', 'autocast' or 'masters', got {layout!r}")


def loss_scaling_demo(steps: int = 30, init_scale: float = 2.0 ** 24, growth_interval: int = 4, seed: int = 0,
                      device: str = "cpu") -> list[dict]:
    """fp16 with a too-large loss scale: the first steps overflow (skipped, scale halved), then training recovers.

    Returns one row per step: scale used, whether the step was skipped (inf/NaN gradients), and the loss.
    Also reports, at step 0, the share of gradient elements an *unscaled* fp16 backward flushes to zero.
    """
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    x = torch.randn(64, 32, generator=g).to(device)
    y = torch.randn(64, 1, generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=init_scale, growth_interval=growth_interval)
    rows = []
    for step in range(steps):
        with torch.autocast(torch.device(device).type, dtype=torch.float16):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        rows.append(dict(step=step, scale=scale, skipped=not finite, loss=float(loss.detach())))
    return rows


def fp16_underflow_share(values: torch.Tensor, scale: float = 1.0) -> float:
    """Share of nonzero ``values`` that become 0 when stored in fp16 after multiplying by ``scale``."""
    nonzero = values != 0
    flushed = ((values * scale).half() == 0) & nonzero
    return float(flushed.sum()) / max(1, int(nonzero.sum()))
