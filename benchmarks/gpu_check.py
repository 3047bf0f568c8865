"""The GPU check: run what the course promises on a machine with NVIDIA GPUs, and write one JSON of results.

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json] [--skip notebooks]

Sections, each timed and recorded as passed / failed / skipped with the tail of its output, so one broken part
never hides the others:

    gpu_tests     tests/test_gpu.py: NCCL with one rank per GPU, CUDA tensors over Gloo with two ranks sharing
                  one GPU, the CUDA-event timeline, the scaling sweep on GPUs
    device_guard  tests/test_device_guard.py: every runner keeps its tensors on ctx.device
    notebooks     every lesson notebook in quick mode (nbval; needs nbval, nbformat, nbclient, ipykernel)
    scaling       `simlib scaling --quick` on the GPU(s)
    trainer       project 1's trainer, 600 steps at full size on one GPU (`simlib train gpt --plan single`)
    calibration   GEMM rate by shape (bf16, CUDA events) and HBM bandwidth (x.add_(y)) beside the
                  presets' figures (`sim.dgx_h100()`; an H200 has the H100's compute and 4.8 TB/s HBM3e)

Without a GPU it says so and exits 0 after recording every section as skipped: it is the check to run when a
machine with a GPU is lent (see tests/gpu_check.sh), not a CI test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

GEMM_SHAPES = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (2048, 12288, 4096),
               (16384, 1024, 4096), (512, 512, 512)]  # (m, k, n): square, a GPT-style MLP, skinny, tiny


def _run(cmd, timeout, env=None) -> dict:
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **(env or {})})
        status = "passed" if out.returncode == 0 else "failed"
        text = (out.stdout + out.stderr)[-4000:]
        code = out.returncode
    except subprocess.TimeoutExpired as exc:
        status, code = "failed", None
        text = f"timed out after {timeout} s\n" + ((exc.stdout or b"")[-3000:].decode(errors="replace")
                                                   if isinstance(exc.stdout, bytes) else str(exc.stdout or "")[-3000:])
    return {"status": status, "returncode": code, "seconds": round(time.perf_counter() - start, 1),
            "command": " ".join(map(str, cmd)), "output_tail": text}


def device_rates(device: str = "cuda") -> dict:
    """GEMM TFLOP/s by shape (bf16 and fp32) and memory bandwidth on ``device``, timed with CUDA events."""
    import torch

    def timed(fn, repeats=20, warmup=3):
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        return times[len(times) // 2]

    gemms = []
    for dtype in (torch.bfloat16, torch.float32):
        for m, k, n in GEMM_SHAPES:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = timed(lambda: a @ b)
            gemms.append({"dtype": str(dtype).removeprefix("torch."), "m": m, "k": k, "n": n,
                          "seconds": t, "tflops": 2 * m * k * n / t / 1e12})
            del a, b
    x = torch.randn(512 << 20, device=device)  # 2 GiB: far beyond the 60 MB L2
    y = torch.randn(512 << 20, device=device)
    t = timed(lambda: x.add_(y), repeats=10)
    hbm = 3 * x.numel() * 4 / t  # read x, read y, write x
    del x, y
    torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    return {"device_name": props.name, "memory_gib": round(props.total_memory / 2 ** 30, 1),
            "multiprocessors": props.multi_processor_count, "gemms": gemms, "hbm_bytes_per_s": hbm}


def compare_with_presets(rates: dict) -> dict:
    """The measured rates beside the presets the simulator uses for Hopper GPUs."""
    from simlib import sim

    h100 = sim.dgx_h100()
    best_bf16 = max(g["tflops"] for g in rates["gemms"] if g["dtype"] == "bfloat16")
    h200 = "H200" in rates["device_name"]
    hbm_spec = 4.8e12 if h200 else h100.memory_bandwidth  # NVIDIA H200 datasheet: 4.8 TB/s HBM3e
    return {"preset": h100.name, "preset_bf16_peak_tflops": h100.peak("bf16") / 1e12,
            "measured_best_bf16_tflops": best_bf16,
            "measured_over_peak": best_bf16 / (h100.peak("bf16") / 1e12),
            "hbm_spec_bytes_per_s": hbm_spec, "measured_hbm_over_spec": rates["hbm_bytes_per_s"] / hbm_spec}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--skip", nargs="*", default=[], help="sections to leave out")
    args = parser.parse_args(argv)

    import torch

    from report import machine, write

    py = sys.executable
    quick = {"SIMLIB_QUICK": "1"}
    sections = {
        "gpu_tests": lambda: _run([py, "-m", "pytest", "tests/test_gpu.py", "-q", "-p", "no:nbval", "-o",
                                   "addopts=", "-rs"], 600),
        "device_guard": lambda: _run([py, "-m", "pytest", "tests/test_device_guard.py", "-q", "-p", "no:nbval",
                                      "-o", "addopts="], 600),
        "notebooks": lambda: _run([py, "-m", "pytest", "notebooks", "--nbval-lax", "--nbval-current-env", "-q",
                                   "-o", "addopts=", "-p", "no:cacheprovider"], 1500, quick),
        "scaling": lambda: _run([py, "-m", "simlib", "scaling", "--quick", "--out", "/tmp/gpu_check_scaling"], 600),
        "trainer": lambda: _run([py, "-m", "simlib", "train", "gpt", "--world-size", "1", "--plan", "single",
                                 "--out", "/tmp/gpu_check_gpt"], 900),  # full size: 600 steps
    }
    load_before = os.getloadavg()
    result = {"benchmark": "gpu_check", "cuda": torch.cuda.is_available(),
              "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0, "sections": {}}
    if not result["cuda"]:
        print("gpu_check: no CUDA GPU here; every section skipped (run this on a machine with a GPU)")
    for name, fn in sections.items():
        if not result["cuda"] or name in args.skip:
            result["sections"][name] = {"status": "skipped"}
            continue
        print(f"gpu_check: {name} ...", flush=True)
        result["sections"][name] = fn()
        print(f"gpu_check: {name} {result['sections'][name]['status']} "
              f"in {result['sections'][name]['seconds']} s", flush=True)
    if result["cuda"] and "calibration" not in args.skip:
        start = time.perf_counter()
        try:
            rates = device_rates()
            result["sections"]["calibration"] = {"status": "passed", "rates": rates,
                                                 "vs_preset": compare_with_presets(rates),
                                                 "seconds": round(time.perf_counter() - start, 1)}
        except Exception as exc:  # recorded, never hides the other sections
            result["sections"]["calibration"] = {"status": "failed", "error": repr(exc)}
    else:
        result["sections"]["calibration"] = {"status": "skipped"}
    result["machine"] = machine(load_before, gpus=result["gpus"])
    out = write(json.loads(json.dumps(result, default=str)), args.out)
    print(json.dumps({k: v["status"] for k, v in result["sections"].items()}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
