"""Compute time of GEMMs on a machine: the rate measured for an exact shape, else the GFLOPs-keyed table."""
from __future__ import annotations


def gemm_time(m, k, n, hardware, dtype="bf16", processes=1, threads=None) -> float:
    """Seconds of one (m×k)·(k×n) GEMM: the rate measured for this exact shape if calibrate() timed it,
    else the GFLOPs-keyed table (efficiency against size)."""
    flops = 2.0 * m * k * n
    if flops == 0:
        return 0.0
    rate = hardware.gemm_shape_rate(m, k, n, processes, threads) if hasattr(hardware, "gemm_shape_rate") else None
    return flops / (rate or hardware.gemm_rate(flops / 1e9, dtype, processes, threads))


def gemms_time(gemms, hardware, dtype="bf16", processes=1, threads=None) -> float:
    return sum(c * gemm_time(m, k, n, hardware, dtype, processes, threads) for m, k, n, c in gemms)
