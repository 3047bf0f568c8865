"""Project 2, computer vision: a small ResNet with BatchNorm on real handwritten digits.

Data: scikit-learn's ``load_digits`` (1,797 real 8x8 digits written by 43 people, UCI; BSD-3, inside the
scikit-learn wheel, so nothing downloads). It is small, so each image is upscaled (bilinear, 8x8 ->
``image_size``) and augmented on the fly - a random rotation, scale and shift per sample - which makes the
work per step real and every step's images new. A stratified 25 % split is held out and never trained on.

Seeding (see :mod:`simlib.projects.seeding`): the global batch of ``step`` is drawn from a generator seeded
by ``(seed, step)``: which images (an epoch-wise permutation) and each sample's augmentation parameters. A
rank warps only its own slice, so a 1-, 2- or 4-rank run sees the very same global batch. ``loader =
"same_seed"`` plants the classic bug (every rank draws its own batch from the same seed) for the lesson.

Model: a ResNet (He et al. 2016) cut down to three stages of basic blocks (conv-BN-ReLU-conv-BN + shortcut),
global average pooling and a linear head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ... import guards
from .. import check_data_device, data_device, positive_int
from ..seeding import generator

__all__ = ["DigitsTask", "ResNet", "BasicBlock", "load_digits_split", "baseline_logistic", "LOADERS"]

LOADERS = ("global", "per_rank", "same_seed")


@lru_cache(maxsize=4)
def load_digits_split(holdout: float = 0.25, split_seed: int = 0):
    """(x_train, y_train, x_test, y_test): 8x8 images in [0, 1] as float32 tensors, a stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.images.astype(np.float32) / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=holdout, random_state=split_seed, stratify=digits.target
    )
    t = torch.from_numpy
    return t(x_tr), t(y_tr).long(), t(x_te), t(y_te).long()


def baseline_logistic(holdout: float = 0.25, split_seed: int = 0) -> float:
    """Held-out accuracy of multinomial logistic regression on the raw 64 pixels (the baseline beside the CNN)."""
    from sklearn.linear_model import LogisticRegression

    x_tr, y_tr, x_te, y_te = load_digits_split(holdout, split_seed)
    clf = LogisticRegression(max_iter=2000).fit(x_tr.reshape(len(x_tr), -1).numpy(), y_tr.numpy())
    return float(clf.score(x_te.reshape(len(x_te), -1).numpy(), y_te.numpy()))


def upscale(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 8, 8) -> (N, 1, size, size), bilinear."""
    return F.interpolate(x.unsqueeze(1), size=(size, size), mode="bilinear", align_corners=False)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (1x1 conv + BN when the shape changes), then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):  # (B, c_in, H, W) -> (B, c_out, H/stride, W/stride)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """Stem conv, three stages (width, 2·width, 4·width; the last two halve H and W), pool, linear head."""

    def __init__(self, width: int = 16, blocks_per_stage: int = 1, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, c = [], width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(blocks_per_stage):
                layers.append(BasicBlock(c, c_out, stride=2 if (stage > 0 and i == 0) else 1))
                c = c_out
        self.blocks = nn.ModuleList(layers)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x):  # (B, 1, S, S) -> (B, num_classes) logits
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


@dataclass
class DigitsTask:
    """The vision project as a ``Task`` for ``simlib.train`` (see TRAIN_API: build_model, batch, loss, evaluate)."""

    global_batch: int = 128  # samples per optimizer step over all ranks
    image_size: int = 16  # 8x8 digits upscaled to this (work per sample grows with its square)
    width: int = 16  # channels of the first stage (then 2x, 4x)
    blocks_per_stage: int = 1
    augment: bool = True  # random rotation (±12°), scale (0.9-1.1) and shift (±1 source pixel)
    loader: str = "global"  # "global": slices of one seeded global batch (world-size invariant);
    # "per_rank": each rank draws its own batch, seed (seed, step, rank);
    # "same_seed": the bug - each rank draws from (seed, step) alone
    augment_on: str = "cpu"  # where images are upscaled and warped: "cpu", or "cuda" (this rank's GPU
    # when there is one: the GPU size; the same draws, rounded differently)
    seed: int = 0
    holdout: float = 0.25
    name: str = field(default="vision", init=False)
    _data: tuple = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        guards.check_task(self)  # every field, one line naming a wrong one
        for key in ("global_batch", "image_size", "width", "blocks_per_stage"):
            positive_int(key, getattr(self, key))
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8 (the digits are 8x8), got {self.image_size}")
        check_data_device("augment_on", self.augment_on)
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        if not 0 < self.holdout < 1:
            raise ValueError(f"holdout must be a fraction in (0, 1), got {self.holdout!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    # ---- data ----
    @property
    def data(self):
        """(x_train, y_train, x_test, y_test), loaded once and kept: it travels with the task to the workers."""
        if self._data is None:
            self._data = load_digits_split(self.holdout)
        return self._data

    @property
    def num_train(self) -> int:
        return len(self.data[0])

    def _indices(self, step: int, n: int, gen_keys) -> torch.Tensor:
        """Sample indices for ``n`` samples of the per-rank loaders (drawn with replacement from ``gen_keys``)."""
        return torch.randint(self.num_train, (n,), generator=generator(*gen_keys))

    def shard(self, step: int, part: int = 0, parts: int = 1) -> torch.Tensor:
        """The global loader's sample indices for part ``part`` of ``parts`` of ``step``'s global batch: the
        learner's ``data_shard`` piece when a run has one (:mod:`simlib.pieces`), else the course's own
        (:func:`simlib.projects.vision.sampler.data_shard`); checked here, so a wrong piece fails clearly."""
        from ... import pieces
        from .sampler import data_shard, epoch_order

        piece = pieces.get("data_shard")
        b = self.global_batch // parts
        out = (piece or data_shard)(
            step, part, parts, self.global_batch, self.num_train, epoch_order(self.seed, self.num_train)
        )
        if piece is not None:
            ok = isinstance(out, torch.Tensor) and out.shape == (b,) and not out.is_floating_point()
            ok = ok and out.dtype != torch.bool and not out.is_complex()
            if ok and b:
                ok = 0 <= int(out.min()) and int(out.max()) < self.num_train
            if not ok:
                what = f"shape {tuple(out.shape)}, {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(
                    f"your data_shard piece returned {what} at step {step}, rank {part} of {parts}; it must return "
                    f"{b} integer sample indices in [0, {self.num_train}) (global_batch {self.global_batch} / {parts})"
                )
        return out.long()

    def _augment_params(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """(n, 2, 3) affine matrices: rotation, isotropic scale, shift, per sample."""
        u = torch.rand(n, 4, generator=gen) * 2 - 1
        angle = u[:, 0] * math.radians(12)
        scale = 1 + 0.1 * u[:, 1]
        shift = u[:, 2:] * (2.0 / 8)  # ±1 source pixel in grid units ([-1, 1] spans 8 pixels)
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        return torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)

    def batch(self, step: int, part: int = 0, parts: int = 1):
        """(x, y) of ``step``: x (B/parts, 1, S, S) float32, y (B/parts,) int64 - part ``part`` of ``parts``.

        With the default loader the parts concatenate to the same global batch for any ``parts``.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not (isinstance(parts, int) and parts >= 1 and isinstance(part, int) and 0 <= part < parts):
            raise ValueError(f"need 0 <= part < parts, got part={part!r}, parts={parts!r}")
        if self.global_batch % parts:
            raise ValueError(
                f"global_batch {self.global_batch} does not split into {parts} equal parts; "
                f"use a world size (x accumulation) that divides it"
            )
        b = self.global_batch // parts
        x_tr, y_tr = self.data[0], self.data[1]
        if self.loader == "global":
            gen = generator(self.seed, 2, step)
            idx = self.shard(step, part, parts)
            theta = self._augment_params(self.global_batch, gen)[part * b : (part + 1) * b]
        else:
            keys = (self.seed, 3, step, part) if self.loader == "per_rank" else (self.seed, 3, step)
            gen = generator(*keys)
            idx = self._indices(step, b, keys + (1,))  # its own stream, apart from the augmentations
            theta = self._augment_params(b, gen)
        dev = data_device(self.augment_on)  # the draws above stay on the CPU: the same batch on any device
        return self._images(x_tr[idx].to(dev), theta.to(dev)), y_tr[idx].to(dev)

    def _images(self, x8: torch.Tensor, theta: torch.Tensor | None) -> torch.Tensor:
        x = upscale(x8, self.image_size)
        if self.augment and theta is not None:
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return (x - 0.3) / 0.4  # roughly zero mean, unit spread

    def test_set(self):
        """The held-out images (upscaled, never augmented) and labels."""
        _, _, x_te, y_te = self.data
        return self._images(x_te, None), y_te

    # ---- model, loss, evaluation ----
    def build_model(self) -> nn.Module:
        torch.manual_seed(self.seed)  # the same initial weights whatever the world size
        return ResNet(self.width, self.blocks_per_stage)

    def blocks(self, model: nn.Module) -> list:
        return list(_unwrap(model).blocks)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int = 512) -> dict:
        """Held-out accuracy and loss (eval mode: BatchNorm uses its running statistics)."""
        x, y = self.test_set()
        net = _unwrap(model)
        was_training = net.training
        net.eval()
        device = next(net.parameters()).device
        logits = torch.cat([net(x[i : i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)])
        net.train(was_training)
        return {
            "accuracy": float((logits.argmax(1) == y).float().mean()),
            "eval_loss": float(F.cross_entropy(logits, y)),
        }

    @property
    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs per sample (3 x forward; convolutions and the head as GEMMs)."""
        return 3 * conv_gemm_flops(ResNet(self.width, self.blocks_per_stage), self.image_size)

    def sim_spec(self):
        """The model for ``simlib.sim``: each convolution as its im2col GEMM (one row per output pixel);
        BatchNorm, ReLU and the residual add as element-wise work on every convolution's output."""
        from ...sim import ModelSpec

        model = self.build_model()
        gemms = conv_gemms(model, self.image_size)
        outputs = sum(m * n for m, _, n in gemms[:-1])  # conv output elements per sample
        return ModelSpec(
            f"ResNet-{self.width} on {self.image_size}x{self.image_size}",
            sum(p.numel() for p in model.parameters()),
            len(gemms),
            max(n for _, _, n in gemms),
            linears=tuple((k, n) for _, k, n in gemms),
            rows=tuple(m for m, _, _ in gemms),
            activation_width=3 * outputs,  # BN, ReLU (and add): ~3 passes per output
            param_numels=tuple(p.numel() for p in model.parameters()),
        )


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def conv_gemms(model: nn.Module, image_size: int) -> list[tuple[int, int, int]]:
    """Each Conv2d / Linear of one sample's forward as a GEMM (m, k, n): im2col view, m = output pixels."""
    shapes: list = []
    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(
                m.register_forward_hook(
                    lambda mod, i, o: shapes.append(
                        (
                            o.shape[2] * o.shape[3],
                            mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1],
                            mod.out_channels,
                        )
                    )
                )
            )
        elif isinstance(m, nn.Linear):
            hooks.append(
                m.register_forward_hook(lambda mod, i, o: shapes.append((1, mod.in_features, mod.out_features)))
            )
    was = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 1, image_size, image_size))
    model.train(was)
    for h in hooks:
        h.remove()
    return shapes


def conv_gemm_flops(model: nn.Module, image_size: int) -> float:
    return float(sum(2 * m * k * n for m, k, n in conv_gemms(model, image_size)))
