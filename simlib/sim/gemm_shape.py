"""A GEMM's rate by its shape, not by its FLOPs only: output tiles in waves over the SMs, each tile's loop over k.

The presets' GEMM tables are keyed by GFLOPs, measured on cubes (m = k = n). A GPT's GEMMs are not cubes: at
hidden 768 a step's ``(16384 x 768) @ (768 x 2304)`` has the FLOPs of a 3072-cube but far more output tiles to
spread over the SMs and a shorter inner loop; keyed by FLOPs alone the simulator priced GPT-2 small at 28.5 % MFU.
Here one GEMM of ``(m, k)`` by ``(k, n)`` (``count`` of them in one batched call) takes

    t = t0 + ceil(count · ceil(m/128) · ceil(n/128) / SMs) · 2 · 128 · 128 · (k + k0) / rate_per_SM

(cuBLAS's 128 x 128 output tiles, one per SM at a time: a wave; ``k0``: each tile's prologue and epilogue in
units of k; ``t0``: the fixed cost of a lone GEMM as timed with CUDA events). :func:`fit` finds ``t0``, ``k0`` and
the rate from measured shapes; :data:`MODELS` holds the fit for each preset measured by shape. On the H200's six
measured bf16 shapes (the GPU check, 2026-12-04: cubes 512..8192, 2048 x 12288 x 4096, 16384 x 1024 x 4096) the
fit is within 2.2 % of every one; a preset without a fit keeps its FLOPs table (:func:`gemm_shape_rate`).
"""

from __future__ import annotations

import math

TILE = 128
# name of the preset -> {"sms", "t0" (s), "k0", "rate_per_sm" (FLOP/s), "dtype", "source"}
MODELS = {
    "DGX H200": {
        "sms": 132,
        "t0": 20e-6,
        "k0": 128,
        "rate_per_sm": 6.45e12,
        "dtype": "bf16",
        "source": "fitted to the six bf16 GEMMs the GPU check measured on an H200 (H200_MEASURED_GEMM and "
        "16384 x 1024 x 4096 at 652 TFLOP/s): every one within 2.2 %",
    },
}


def shape_time(shape, model: dict, count: int = 1) -> float:
    """Seconds of ``count`` GEMMs of ``shape`` = (m, k, n) in one call under ``model`` (see the module doc)."""
    m, k, n = (int(v) for v in shape)
    if min(m, k, n) <= 0:
        return 0.0
    tiles = count * math.ceil(m / TILE) * math.ceil(n / TILE)
    waves = math.ceil(tiles / model["sms"])
    return model["t0"] + waves * 2 * TILE * TILE * (k + model["k0"]) / model["rate_per_sm"]


def gemm_shape_rate(hardware, shape, dtype: str = "bf16", count: int = 1) -> float:
    """FLOP/s of ``count`` GEMMs of ``shape`` on ``hardware``: the shape model where the preset has one for this
    dtype (:data:`MODELS`), never above the FLOPs table's best; else the FLOPs table (``Hardware.gemm_rate``)."""
    m, k, n = shape
    flops = 2.0 * m * k * n * count
    model = MODELS.get(hardware.name)
    if model is None or model["dtype"] != dtype or not hardware.peak_flops:
        return hardware.gemm_rate(flops / 1e9, dtype)
    best = hardware.peak(dtype) * max(e for _, e in hardware.gemm_table[dtype])
    return min(flops / shape_time(shape, model, count), best) if flops else best


def fit(measured, sms: int, dtype: str = "bf16") -> dict:
    """The model's ``t0``, ``k0`` and rate per SM fitted to ``measured`` = [((m, k, n), FLOP/s)] (a grid search
    minimising the worst relative error), with ``worst`` (that error). What a GPU check's calibration runs to give
    a part its :data:`MODELS` entry."""
    rates = [r for _, r in measured]
    best = None
    top = max(rates) / sms
    for t0 in [i * 1e-6 for i in range(0, 41)]:
        for k0 in (0, 32, 64, 128, 192, 256, 384):
            for j in range(0, 61):
                per_sm = top * (0.9 + 0.01 * j)
                model = {"sms": sms, "t0": t0, "k0": k0, "rate_per_sm": per_sm, "dtype": dtype}
                worst = max(
                    abs(math.log(2 * m * k * n / shape_time((m, k, n), model) / r)) for (m, k, n), r in measured
                )
                if best is None or worst < best["worst"]:
                    best = {**model, "worst": worst}
    best["worst"] = math.exp(best["worst"]) - 1
    return best
