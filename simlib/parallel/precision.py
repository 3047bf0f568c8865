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

__all__ = ["DTYPES", "autocast", "LossScaler", "MasterWeightsOptimizer", "bytes_per_parameter", "loss_scaling_demo"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None, "fp32": None}


def autocast(device, precision: str | None):
    """``torch.autocast`` for ``precision`` ("bf16" on CPU or GPU, "fp16" on GPU) or a no-op for None/"fp32"."""
    if precision not in DTYPES:
        raise ValueError(f"mixed_precision must be None, 'fp32', 'bf16' or 'fp16', got {precision!r}")
    device_type = torch.device(device).type
    if precision == "fp16" and device_type == "cpu":
        raise ValueError(
            "fp16 autocast needs a GPU here (and loss scaling); on CPU use mixed_precision='bf16', "
            "which has fp32's range and needs no scaling"
        )
    return nullcontext() if DTYPES[precision] is None else torch.autocast(device_type, dtype=DTYPES[precision])


class LossScaler:
    """Dynamic loss scaling, as ``torch.amp.GradScaler`` does it, with the skip decided by every rank together.

        scaler = LossScaler()
        (loss * scaler.scale).backward()
        if scaler.unscale_(params):       # grads / scale; False when any rank found inf/NaN (one all-reduce)
            optimizer.step()              # skipped otherwise: every rank skips the same step
        scaler.update()                   # halve the scale after an overflow, double it after a run of good steps

    Why not GradScaler itself: it checks only this rank's gradients. Under tensor, pipeline or ZeRO-2/3
    parallelism ranks hold different gradients, so one rank could skip a step that another takes and the
    replicas would drift apart silently (torch's ``ShardedGradScaler`` agrees the same way for FSDP).
    Works on any device and dtype, so the loop's scaling path is tested on CPU in fp32 (power-of-two scales
    are exact there).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        group=None,
    ):
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError(
                "LossScaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, "
                f"{growth_interval}"
            )
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.group = group
        self.good_steps = 0
        self.found_inf = False
        self.skipped = 0

    @torch.no_grad()
    def unscale_(self, params) -> bool:
        """Divide the gradients of ``params`` by the scale; True if every rank's gradients are finite."""
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        device = grads[0].device if grads else torch.device("cpu")
        bad = torch.zeros((), device=device)
        for g in grads:
            g.mul_(1.0 / self.scale)
            bad += (~torch.isfinite(g)).any()
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.group)
        self.found_inf = bool(bad > 0)
        return not self.found_inf

    def update(self) -> None:
        """After the step: back off after an overflow, grow after ``growth_interval`` good steps in a row."""
        if self.found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0
        self.found_inf = False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.skipped = int(state.get("skipped", 0))


class MasterWeightsOptimizer(torch.optim.Optimizer):
    """Steps fp32 master copies of 16-bit parameters with ``inner_cls``, then copies them back rounded.

    The model holds bf16 weights and gradients (2 + 2 bytes); this object holds the fp32 masters (4) and the
    inner optimizer's states (Adam: 8). Without masters, small updates vanish: bf16 keeps 8 bits of mantissa,
    so w + 1e-4·w == w.
    """

    def __init__(self, params, inner_cls=torch.optim.AdamW, **kwargs):
        super().__init__(params, kwargs)
        self.masters = [
            p.detach().float().clone().requires_grad_(p.requires_grad) for g in self.param_groups for p in g["params"]
        ]
        it = iter(self.masters)
        self.inner = inner_cls(
            [
                {**{k: v for k, v in g.items() if k != "params"}, "params": [next(it) for _ in g["params"]]}
                for g in self.param_groups
            ]
        )

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


def loss_scaling_demo(
    steps: int = 30, init_scale: float = 2.0**24, growth_interval: int = 4, seed: int = 0, device: str = "cpu"
) -> list[dict]:
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
