"""The DGX H200 preset, from the course's own GPU check on a real H200 (benchmarks/results/gpu_check.json)."""

import json
from pathlib import Path

import pytest

from simlib import sim
from simlib.sim.hardware import GB
from simlib.sim.hardware_presets import AZURE_H200_ALLREDUCE

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "gpu_check.json"


def test_h200_reproduces_the_measured_gemm_rates_and_hbm():
    hw = sim.preset("h200")
    assert hw.name == "DGX H200" and hw.peak("bf16") == 989e12
    for m, tflops in ((8192, 785), (1024, 84), (512, 11)):  # the calibration's square bf16 GEMMs
        rate = hw.gemm_rate(2 * m**3 / 1e9, "bf16") / 1e12
        assert rate == pytest.approx(tflops, rel=0.05), (m, rate)  # the figures rounded
    assert hw.gemm_rate(2 * 8192**3 / 1e9, "fp32") / 1e12 == pytest.approx(51, rel=0.02)
    # a large memory-bound kernel reaches what x.add_(y) measured: 4.32 TB/s = 0.90 of 4.8
    assert hw.achievable_bandwidth(6 * 2**30) == pytest.approx(4.32e12, rel=0.01)


def test_h200_numbers_are_the_committed_measurement():
    """The preset's table is the committed check's numbers, not a copy that drifted."""
    rates = json.loads(RESULTS.read_text())["sections"]["calibration"]["rates"]
    hw = sim.dgx_h200()
    for g in rates["gemms"]:
        dtype = {"bfloat16": "bf16", "float32": "fp32"}[g["dtype"]]
        if g["m"] == g["k"] == g["n"] or (g["m"], g["k"]) == (2048, 12288):
            gflops = 2 * g["m"] * g["k"] * g["n"] / 1e9
            assert hw.gemm_rate(gflops, dtype) / 1e12 == pytest.approx(g["tflops"], rel=0.01), g
    assert sim.hardware_presets.H200_HBM_MEASURED == pytest.approx(rates["hbm_bytes_per_s"], rel=0.01)


def test_h200_link_follows_azures_published_curve_and_a_hand_prediction():
    hw = sim.dgx_h200()
    for size, busbw in AZURE_H200_ALLREDUCE:
        assert hw.intra.bus_bandwidth(size) == pytest.approx(busbw * GB, rel=1e-6)
    # one 8192^3 bf16 GEMM's worth of work by hand: 1.0995 TFLOP at 785 TFLOP/s = 1.40 ms
    t = 2 * 8192**3 / hw.gemm_rate(2 * 8192**3 / 1e9, "bf16")
    assert t == pytest.approx(1.4011e-3, rel=0.02)
