"""Compute time of GEMMs on a machine (the rate measured for an exact shape, else the GFLOPs-keyed table) and of
autograd's gradient accumulation."""

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


def accumulate_grad_time(params_here, hardware, strategy, processes=1) -> float:
    """Seconds autograd's AccumulateGrad spends per micro-batch adding each new weight gradient into ``.grad``.

    With ``zero_grad(set_to_none=False)`` (and in every micro-batch after the first under accumulation)
    ``.grad += new`` reads both and writes one: 3 × (bytes per gradient) per parameter, at the bandwidth
    :func:`~simlib.sim.calibrate.calibrate` measured for ``grad.add_(new)`` on a weight-sized tensor (which stays
    partly in cache, so it is not the streaming bandwidth). 0 where that was not measured (presets).
    """
    rate = hardware.accumulate_grad_rate(processes)
    if not rate:
        return 0.0
    bytes_per = 2 if strategy.mixed_precision else 4
    return 3.0 * bytes_per * params_here / rate
