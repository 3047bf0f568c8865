"""The GPU check's calibration: GEMM TFLOP/s by shape and dtype and HBM bandwidth, timed with CUDA events, beside
the simulator's preset of the part it runs on (``simlib.debug.mfu.preset_for``) and the datasheet's dense peak."""

from __future__ import annotations

import time

BUDGET = 30  # seconds (measured on the H200: 1.2 s of timing after a few seconds of start-up)
# (m, k, n): square, a GPT-style MLP, skinny, tiny; then the GPT's GPU size's own GEMMs (16 windows of 1,024
# tokens: qkv, attention out, MLP up, MLP down, the head), which the simulator prices by shape
GEMM_SHAPES = [
    (1024, 1024, 1024),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (2048, 12288, 4096),
    (16384, 1024, 4096),
    (512, 512, 512),
    (16384, 768, 2304),
    (16384, 768, 768),
    (16384, 768, 3072),
    (16384, 3072, 768),
    (16384, 1536, 4608),
    (16384, 1536, 6144),
    (16384, 6144, 1536),
    (16384, 1536, 8192),
]


def device_rates(device: str = "cuda", shapes=GEMM_SHAPES, hbm_elements: int = 512 << 20) -> dict:
    """GEMM TFLOP/s by shape (bf16 and fp32) and memory bandwidth on ``device``, timed with CUDA events (median
    of 20 after 3 warm-ups). ``device="cpu"`` (tests): host clock, small sizes."""
    import torch

    cuda = torch.device(device).type == "cuda"

    def timed(fn, repeats=20, warmup=3):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if cuda:
                start_, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start_.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start_.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    gemms = []
    for dtype in (torch.bfloat16, torch.float32):
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = timed(lambda: a @ b)  # noqa: B023, F821 - timed here; a, b are deleted only after
            gemms.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "m": m,
                    "k": k,
                    "n": n,
                    "seconds": t,
                    "tflops": 2 * m * k * n / t / 1e12,
                }
            )
            del a, b
    x = torch.randn(hbm_elements, device=device)  # 2 GiB on a GPU: far beyond any L2
    y = torch.randn(hbm_elements, device=device)
    t = timed(lambda: x.add_(y), repeats=10)  # noqa: F821 - deleted after the timing
    hbm = 3 * x.numel() * 4 / t  # read x, read y, write x
    del x, y
    if cuda:
        torch.cuda.empty_cache()
        props = torch.cuda.get_device_properties(0)
        facts = {
            "device_name": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
    else:
        facts = {"device_name": "cpu", "memory_gib": None, "multiprocessors": None}
    return {**facts, "gemms": gemms, "hbm_bytes_per_s": hbm}


def compare_with_presets(rates: dict) -> dict:
    """The measured rates beside the simulator's preset of this part (its GEMM efficiency by shape) and the
    datasheet's dense bf16 peak."""
    from simlib import sim
    from simlib.debug.mfu import datasheet_peak, preset_for
    from simlib.sim.gemm_shape import fit, gemm_shape_rate

    name, note = preset_for(rates["device_name"])
    hw = sim.preset(name)
    rows = []
    for g in rates["gemms"]:
        dtype = {"bfloat16": "bf16", "float32": "fp32"}[g["dtype"]]
        if dtype not in hw.peak_flops:
            continue
        shape = (g["m"], g["k"], g["n"])
        by_flops = hw.gemm_rate(2 * g["m"] * g["k"] * g["n"] / 1e9, dtype) / 1e12
        by_shape = gemm_shape_rate(hw, shape, dtype) / 1e12
        rows.append(
            {
                "dtype": dtype,
                "shape": list(shape),
                "measured_tflops": g["tflops"],
                "preset_by_flops_tflops": by_flops,
                "preset_by_shape_tflops": by_shape,
                "measured_over_preset_by_shape": g["tflops"] / by_shape,
            }
        )
    best_bf16 = max(g["tflops"] for g in rates["gemms"] if g["dtype"] == "bfloat16")
    sheet = datasheet_peak(rates["device_name"], "bf16")
    hbm_preset = hw.achievable_bandwidth(6 * 2**30)
    bf16 = [((g["m"], g["k"], g["n"]), g["tflops"] * 1e12) for g in rates["gemms"] if g["dtype"] == "bfloat16"]
    shape_fit = fit(bf16, rates["multiprocessors"]) if rates.get("multiprocessors") else None
    return {
        "preset": hw.name,
        "gemm_shape_fit": shape_fit,  # this part's simlib.sim.gemm_shape.MODELS entry, fitted to what it measured
        "preset_key": name,
        "preset_note": note,
        "gemms": rows,
        "measured_best_bf16_tflops": best_bf16,
        "datasheet_bf16_tflops": sheet / 1e12 if sheet else None,
        "measured_over_datasheet": best_bf16 / (sheet / 1e12) if sheet else None,
        "hbm_preset_bytes_per_s": hbm_preset,
        "measured_hbm_over_preset": rates["hbm_bytes_per_s"] / hbm_preset,
    }


def calibration() -> dict:
    t0 = time.monotonic()
    try:
        rates = device_rates()
        return {
            "status": "passed",
            "rates": rates,
            "vs_preset": compare_with_presets(rates),
            "seconds": round(time.monotonic() - t0, 1),
            "budget": BUDGET,
        }
    except Exception as exc:  # noqa: BLE001 - recorded, never hides the other sections
        return {"status": "failed", "error": repr(exc), "seconds": round(time.monotonic() - t0, 1)}
