"""The hardware presets of A100, H100 and H200 nodes and the CPU box, with their sources (every number's source is on
its line), and the one registry of presets, :data:`PRESETS` (Blackwell's join it from :mod:`simlib.sim.presets`).
What a machine is — :class:`~simlib.sim.hardware.Hardware` and :class:`~simlib.sim.hardware.Link` — lives in
:mod:`simlib.sim.hardware`."""

from __future__ import annotations

from .hardware import GiB, Hardware, Link

# Calculon's GEMM efficiency table for A100/H100 float16 (calculon-ai/calculon, systems/a100_80g.json and
# h100_80g_nvl8.json): GFLOPs of one GEMM -> fraction of peak. Calculon's own validation tunes these per system.
CALCULON_GEMM_EFFICIENCY = [(128, 0.95), (16, 0.9), (1, 0.6), (0.001, 0.1)]
# Calculon's achievable memory bandwidth (systems/a100_80g.json "mem1" MB_efficiency): MB one kernel moves ->
# fraction of the HBM bandwidth. Memory-bound operators (layer norm, softmax, dropout, GeLU, residual adds) and
# the memory side of every GEMM are priced with it.
CALCULON_MEM_EFFICIENCY = [(100, 0.90), (10, 0.75), (1, 0.6), (0.001, 0.3)]


def anchored(table, measured_efficiency):
    """Calculon's curve (how GEMM efficiency falls with size), its height set by one measured large GEMM:
    every point scaled so that the largest reaches ``measured_efficiency``."""
    top = max(e for _, e in table)
    return [(x, e * measured_efficiency / top) for x, e in table]


# Measured large fp16 matmuls (the GEMM rate a preset can actually reach, where Calculon's 95 % is idealised):
# A100 80GB, n = 8192 square (1,100 GFLOPs): 230 TFLOP/s = 73.7 % of 312 (mli/transformers-benchmarks README,
# micro_bench.ipynb); H100 SXM, 4224×8192×2048 bf16 (142 GFLOPs): 780 TFLOP/s = 78.9 % of 989, with
# max-autotune kernels and vboost (a public gist by H. He, "H100 peak matmul FLOPS").
A100_GEMM_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 230 / 312)
H100_GEMM_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 780 / 989)
# The H100's GEMMs in the software of 2023 (PyTorch 2.0/2.1 on cuBLAS 12.0-12.1, what the earliest published H100
# training runs used) ran far below that: a bf16 (2·2048)×8192×8192 matmul in PyTorch measured 549.5 TFLOP/s with
# cuBLAS 12.0.2 on an H100 SXM (pytorch/pytorch issue 100850, May 2023; 742.7 for the 2048-row one, 543 for 4 ×
# 2048 rows). ``dgx_h100(software="2023")`` anchors the curve there.
H100_MATMUL_2023_TFLOPS = 549.5
H100_GEMM_EFFICIENCY_2023 = anchored(CALCULON_GEMM_EFFICIENCY, H100_MATMUL_2023_TFLOPS / 989)
# FP8 GEMMs on H100 reach a lower fraction of their (twice as high) peak: 1,414 TFLOP/s = 71.4 % of 1,979 for
# Llama-70B's QKV shape 16384×8192×1280 (cuBLASLt's scaled_mm, meta-pytorch/float8_experimental PR 38, Aug 2023)
H100_FP8_GEMM_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 1414 / 1979)

# Azure's published nccl-tests all-reduce bus bandwidth, 8 GPUs in one node, (bytes, GB/s).
AZURE_A100_80GB_ALLREDUCE = [(1 << 20, 36), (16 << 20, 109), (128 << 20, 174), (1 << 30, 228)]
AZURE_H200_ALLREDUCE = [(1 << 20, 53), (16 << 20, 240), (128 << 20, 413), (1 << 30, 468)]


# Fused attention kernels reach a fraction of the 16-bit peak (forward, backward); the papers give ranges, and the
# rule here is: forward at the top of the published range, backward (the slower pass) at its bottom.
# - FlashAttention-2 ("flash"): 50-73 % of the A100's peak (Dao 2023, arXiv 2307.08691, abstract), but only about
#   35 % of the H100's (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract: "FlashAttention-2
#   achieving only 35% utilization on H100"; no separate backward figure, so 35 % both ways).
# - FlashAttention-1 and the Triton FlashAttention kernel of the same generation ("flash1"): 25-40 % of the A100's
#   peak (Dao 2023, introduction). On H100 no figure is published: taken as the H100 FA2 figure times FA1/FA2
#   on A100 (an assumption).
A100_FLASH_ATTENTION = {"flash": {"forward": 0.73, "backward": 0.50}, "flash1": {"forward": 0.40, "backward": 0.25}}
# - cuDNN's fused attention ("cudnn"), which Transformer Engine selects over FlashAttention-2 on Hopper and later
#   ("Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance reasons",
#   transformer_engine/pytorch/attention get_attention_backend, since TE 1.2): on H100 SXM5 at head dimension 128,
#   BF16, 8K-16K tokens, 529-539 TFLOP/s forward with the causal mask and 516-518 backward (Shah et al. 2024,
#   FlashAttention-3, figures 5 and 6: cuDNN's bars; the backward figure's mask is not stated), 0.54 and 0.52 of the
#   989 TFLOP/s peak. Megatron-Core and NeMo rows run it (scale_runs.strategy_of). The cuDNN of a given release may
#   have been slower (the paper measured mid-2024's): the simulator does not know software versions.
H100_FLASH_ATTENTION = {
    "flash": {"forward": 0.35, "backward": 0.35},
    "flash1": {"forward": 0.35 * 0.40 / 0.73, "backward": 0.35 * 0.25 / 0.50},
    "cudnn": {"forward": 0.54, "backward": 0.52},
}


def dgx_a100(memory_gb: int = 80) -> Hardware:
    """DGX A100 80 GB: 8 GPUs per node on NVSwitch, one 200 Gb/s HDR InfiniBand NIC per GPU.

    ``memory_gb=40``: the A100 40 GB (HBM2 at 1.555 TB/s, same peak FLOP/s; NVIDIA A100 datasheet).

    Peak 312 TFLOP/s bf16/fp16 dense, 156 tf32, 19.5 fp32; 80 GB (80 GiB) HBM2e at 2.039 TB/s (NVIDIA A100
    datasheet).
    Inside a node: Azure's nccl-tests all-reduce bus bandwidth on 8× A100-SXM4-80GB (36 GB/s at 1 MB …
    228 GB/s at 1 GB), used as a curve (bus bandwidth by message size); α and B are also fitted to it.
    Between nodes: one 200 Gb/s HDR NIC per GPU (eight per node, as on the DGX A100 and Selene), ~23 GB/s per
    NIC, half of the ~46–48 GB/s measured on NDR 400 Gb/s (nccl-tests issue 290); 5 µs per step is an
    assumption (not measured). GEMM efficiency: Calculon's curve, anchored at a measured 230 TFLOP/s for a
    large fp16 matmul (:data:`A100_GEMM_EFFICIENCY`); a GEMM takes the longer of its math and its own memory
    traffic (roofline: that measurement already includes the GEMM's own loads). Achievable memory bandwidth for
    memory-bound kernels: Calculon's table (systems/a100_80g.json). Fused attention: FlashAttention-2's
    published fraction of peak (:data:`A100_FLASH_ATTENTION`).
    """
    if memory_gb not in (40, 80):
        raise ValueError(f"an A100 has 40 or 80 GB, got {memory_gb!r}")
    return Hardware(
        name=f"DGX A100 {memory_gb}GB",
        peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
        memory_bytes=memory_gb * GiB,
        memory_bandwidth=2.039e12 if memory_gb == 80 else 1.555e12,
        attention_efficiency=A100_FLASH_ATTENTION,
        host_link=32e9,  # PCIe Gen4 x16 to the host, each way
        intra=Link.from_busbw(AZURE_A100_80GB_ALLREDUCE, 8, "Azure nccl-tests, 8x A100-SXM4-80GB", keep_curve=True),
        inter=Link(5e-6, 23e9, {}, "HDR 200 Gb/s per GPU: half of NDR's ~47 GB/s (nccl-tests #290); α assumed"),
        devices_per_node=8,
        gemm_table={"bf16": A100_GEMM_EFFICIENCY},
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA A100 datasheet; Azure nccl-tests; Calculon systems/a100_80g.json; "
        "mli/transformers-benchmarks (A100 matmul)",
    )


def dgx_h100(software: str = "today") -> Hardware:
    """DGX H100: 8 H100 SXM per node on NVLink 4 / NVSwitch, one 400 Gb/s NDR NIC per GPU.

    Peak 989 TFLOP/s bf16 dense, 1979 fp8, 67 fp32; 80 GB HBM3 at 3.35 TB/s (NVIDIA H100 datasheet).
    Inside a node: an NCCL maintainer puts NVLink line rate at 450 GB/s and ring bus bandwidth at ~370 GB/s
    (nccl-tests issue 212); we cap the bandwidth at 370 GB/s and take α from a fit to Azure's 8× H200
    nccl-tests (same NVLink 4 generation; 53 GB/s at 1 MB … 468 at 1 GB with NVLink SHARP, which beats a ring).
    Between nodes: 47 GB/s per NIC measured on NDR (nccl-tests issue 290); α = 5 µs assumed.
    GEMM efficiency: Calculon's curve anchored at a measured 780 TFLOP/s bf16 matmul (:data:`H100_GEMM_EFFICIENCY`);
    achievable memory bandwidth: Calculon's table. Fused attention: FlashAttention-2 on H100
    (:data:`H100_FLASH_ATTENTION`). FP8 GEMMs: the FP8 peak on the same curve anchored at a measured FP8
    matmul (:data:`H100_FP8_GEMM_EFFICIENCY`, 71 % of the FP8 peak where bf16 reaches 79 %).
    ``software="2023"``: the GEMM curve anchored at the 549.5 TFLOP/s PyTorch measured on H100 with cuBLAS 12.0
    (:data:`H100_GEMM_EFFICIENCY_2023`), for runs made with the software of 2023.
    """
    if software not in ("today", "2023"):
        raise ValueError(f"software must be 'today' or '2023', got {software!r}")
    table = H100_GEMM_EFFICIENCY if software == "today" else H100_GEMM_EFFICIENCY_2023
    h200 = Link.from_busbw(AZURE_H200_ALLREDUCE, 8)
    return Hardware(
        name="DGX H100" + (" (2023 software)" if software == "2023" else ""),
        peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 67e12},
        memory_bytes=80 * GiB,
        memory_bandwidth=3.35e12,
        attention_efficiency=H100_FLASH_ATTENTION,
        host_link=64e9,  # PCIe Gen5 x16 to the host, each way (NVIDIA H100 datasheet: 128 GB/s both ways)
        intra=Link(h200.alpha, 370e9, {}, "ring busbw 370 GB/s (nccl-tests #212); α fitted to Azure H200"),
        inter=Link(5e-6, 47e9, {}, "NDR 400 Gb/s: ~46-48 GB/s per NIC (nccl-tests #290); α assumed"),
        devices_per_node=8,
        gemm_table={"bf16": table, "fp8": H100_FP8_GEMM_EFFICIENCY},
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA H100 datasheet; nccl-tests #212, #290; Azure nccl-tests (H200); Calculon"
        + ("; pytorch/pytorch#100850 (2023 matmul)" if software == "2023" else ""),
    )


def cpu_box() -> Hardware:
    """This course's 2-core box, from the planning numbers in the course notes (measured once, by hand).

    Matmul 1024³ (2.1 GFLOPs): 58 GFLOP/s on 1 thread, 81 on 2; 51 each for two 1-thread processes, 28 each
    for four. Gloo all-reduce ≈ 2 ms per call and ≈ 0.7 GB/s bus bandwidth (2 ranks), 0.6 (4 ranks).
    Small GEMMs are assumed to run at half rate below 0.01 GFLOPs. Prefer :func:`calibrate` for today's numbers.
    """

    def curve(rate):
        return [(0.001, 0.3 * rate), (0.01, 0.6 * rate), (0.1, 0.9 * rate), (2.1, rate)]

    return Hardware(
        name="CPU box (2 cores, notes)",
        peak_flops={},
        memory_bytes=8e9,
        memory_bandwidth={1: 8e9, 2: 5e9, 4: 2.5e9},
        intra=Link(1e-3, 0.7e9, {2: (1e-3, 0.7e9), 4: (0.4e-3, 0.6e9)}, "course notes: Gloo on loopback"),
        inter=Link(1e-3, 0.1e9, {}, "not measured: one node only"),
        devices_per_node=4,
        cores=2,
        gemm_table={(1, 1): curve(58e9), (1, 2): curve(81e9), (2, 1): curve(51e9), (4, 1): curve(28e9)},
        source="shared course notes (measured on this box for planning)",
    )


PRESETS = {
    "cpu": cpu_box,
    "a100": dgx_a100,
    "a100-40gb": lambda: dgx_a100(40),
    "h100": dgx_h100,
    "h100-2023": lambda: dgx_h100("2023"),
}


def preset(name: str) -> Hardware:
    """``"cpu"``, ``"a100"``, ``"a100-40gb"``, ``"h100"`` or ``"h100-2023"``."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown hardware preset {name!r}: use one of {sorted(PRESETS)}") from None


# ── DGX H200, calibrated on a real H200 (the course's GPU check, benchmarks/results/gpu_check.json) ──
# Measured on one NVIDIA H200 (torch 2.11 + CUDA 13, 2026-12-04; CUDA events, median of 20), (GEMM GFLOPs,
# TFLOP/s): square m = k = n = 512, 1024, 4096, 8192, and 2048 x 12288 x 4096 (a GPT MLP's shape).
H200_MEASURED_GEMM = {
    "bf16": [(0.268, 11.3), (2.15, 83.8), (137.4, 715.2), (206.2, 771.6), (1099.5, 784.7)],
    "fp32": [(0.268, 6.66), (2.15, 26.5), (137.4, 50.4), (206.2, 50.8), (1099.5, 50.9)],
}
H200_HBM_MEASURED = 4.32e12  # x.add_(y) on 2 GiB tensors: 0.90 of the datasheet's 4.8 TB/s


def dgx_h200() -> Hardware:
    """DGX H200: 8 H200 SXM per node (the H100's compute on NVLink 4 / NVSwitch, 141 GB of HBM3e at 4.8 TB/s).

    Peak 989 TFLOP/s bf16/fp16 dense, 1979 fp8, 67 fp32 (NVIDIA H200 datasheet: the H100 SXM's). GEMM efficiency:
    **measured on a real H200** by the course's GPU check (:data:`H200_MEASURED_GEMM`: bf16 785 TFLOP/s at 8192³
    = 0.79 of peak, 84 at 1024³, 11 at 512³: small GEMMs are launch-bound; fp32 without tf32 ≈ 50 at every large
    shape). Memory: 139.8 GiB as torch reports it; HBM3e 4.8 TB/s (datasheet) with Calculon's achievable-bandwidth
    table, whose 0.90 for large kernels is what the check measured (4.32 TB/s, :data:`H200_HBM_MEASURED`).
    Inside a node: Azure's published nccl-tests all-reduce bus bandwidth on 8x H200 with NVLink SHARP (53 GB/s at
    1 MB, 240 at 16 MB, 413 at 128 MB, 468 at 1 GB), used as the curve; α fitted to it. Between nodes: one NDR
    400 Gb/s NIC per GPU, ~47 GB/s measured (nccl-tests issue 290); α = 5 µs assumed. Fused attention:
    FlashAttention-2 on Hopper (:data:`H100_FLASH_ATTENTION`). Not measured here: multi-GPU collectives (the check
    ran on one GPU), fp8.
    """
    peak = {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 67e12}
    table = {dtype: [(g, t * 1e12 / peak[dtype]) for g, t in points] for dtype, points in H200_MEASURED_GEMM.items()}
    table["fp16"] = table["bf16"]  # the same tensor-core rate (datasheet); fp16 itself not measured
    return Hardware(
        name="DGX H200",
        peak_flops=peak,
        memory_bytes=139.8 * GiB,
        memory_bandwidth=4.8e12,
        attention_efficiency=H100_FLASH_ATTENTION,
        host_link=64e9,  # PCIe Gen5 x16 to the host, each way
        intra=Link.from_busbw(AZURE_H200_ALLREDUCE, 8, "Azure nccl-tests, 8x H200 (NVLink SHARP)", keep_curve=True),
        inter=Link(5e-6, 47e9, {}, "NDR 400 Gb/s: ~46-48 GB/s per NIC (nccl-tests #290); α assumed"),
        devices_per_node=8,
        gemm_table=table,
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA H200 datasheet; GEMM and HBM measured on an H200 (benchmarks/results/gpu_check.json); "
        "Azure nccl-tests (H200); nccl-tests #290; Calculon (memory efficiency)",
    )


PRESETS["h200"] = dgx_h200
