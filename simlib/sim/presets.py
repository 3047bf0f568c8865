"""Blackwell presets (DGX B200, GB200 NVL72 as a 72-GPU NVLink domain, B300) and Hopper's PCIe/NVL parts.

Peaks are dense (no 2:4 sparsity), per GPU, from NVIDIA's datasheets as tabulated by G. Lockwood's notes
(glennklockwood.com/garden/processors/B200, citing NVIDIA): HGX/DGX B200 at 1,000 W — BF16 2.25 PFLOP/s, FP8
4.5, FP4 9, TF32 1.1, FP32 0.08; GB200 at 1,200 W — BF16 2.5, FP8 5, FP4 10, TF32 1.25, FP32 0.09. Memory: DGX
B200 1,440 GB for 8 GPUs (180 GB each; nvidia-smi shows 179 GiB, Vultr's HGX B200 listing), GB200 186 GB (MLPerf's
"GB200-186GB"; 185 GiB), HBM3e at 8 TB/s; capacities below in GiB as a process sees them.
B300 (Blackwell Ultra, HGX B300 / GB300): 288 GB HBM3e (268 GiB) at 8 TB/s; its dense FP4 rises to 15 PFLOP/s
(GB300) while BF16 and FP8 stay as GB200's (NVIDIA's Blackwell Ultra announcement, GTC 2025; an assumption where the datasheet
was not read here). NVLink 5: 1.8 TB/s per GPU both ways, 900 GB/s each way.

Links, measured where possible: eight B200s reach an all-reduce bus bandwidth of "830+" GB/s (NVIDIA/nccl issue
1807, 2025); a GB200's NVLink p2p measured ~770 GB/s one way (Azure/AI-benchmarking-guide issue 7). We take
800 GB/s as the NVLink-5 ring bus bandwidth in an NVL72 domain (an assumption between the two) and α from the
H200 fit. Between domains: one ConnectX-7 400 Gb/s NIC per GPU on B200/GB200 (~47 GB/s measured on NDR,
nccl-tests issue 290), ConnectX-8 800 Gb/s on B300 (2 × that, an assumption).

GEMMs: Calculon's curve anchored at measured matmuls — B200 bf16 1.51 PFLOP/s at 3072³ (67 % of peak) and NVFP4
5.50 PFLOP/s at 6144³ (61 %) (pytorch/ao PR 2427, torchao's bench_matmul.py on a B200, 2025). FP8 is not in that
log: FP8 is anchored at bf16's efficiency × 0.905, the FP8/bf16 ratio measured on H100
(:data:`~simlib.sim.hardware_presets.H100_FP8_GEMM_EFFICIENCY`). Fused attention: the tensor cores' share at FlashAttention-4's 71 % of the bf16 peak forward (1,605 TFLOP/s on a
B200; Zadouri et al. 2026, arXiv 2603.05451), 55 % backward (an assumption), and a second limit, the softmax's
exponentials (:data:`BLACKWELL_EXP_RATE`): Blackwell doubled the tensor cores over Hopper but not the special-function
units (16 exponentials per clock per SM), so cuDNN's forward waits on them; Blackwell Ultra (B300/GB300) doubles their
throughput (NVIDIA, "Making Softmax More Efficient with NVIDIA Blackwell Ultra", 2025).
"""

from __future__ import annotations

from .hardware import GiB, Hardware, Link
from .hardware_presets import (
    AZURE_H200_ALLREDUCE,
    CALCULON_GEMM_EFFICIENCY,
    CALCULON_MEM_EFFICIENCY,
    H100_FLASH_ATTENTION,
    H100_FP8_GEMM_EFFICIENCY,
    H100_GEMM_EFFICIENCY,
    PRESETS,
    anchored,
)

B200_BF16_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 1.51 / 2.25)
B200_FP8_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 1.51 / 2.25 * 0.905)
B200_FP4_EFFICIENCY = anchored(CALCULON_GEMM_EFFICIENCY, 5.50 / 9.0)
BLACKWELL_ATTENTION = {
    "flash": {"forward": 0.71, "backward": 0.55},
    "flash1": {"forward": 0.71 * 0.40 / 0.73, "backward": 0.55 * 0.25 / 0.50},
}
# Scores per second a B200's softmax gets through in the kernel the published runs used (cuDNN's, through Transformer
# Engine): FlashAttention-4 reaches 1,605 TFLOP/s forward at head dimension 128 by computing part of the exponentials
# in software on the FMA units and is "up to 1.3x faster than cuDNN 9.13" (Zadouri et al. 2026; Together AI's
# FlashAttention-4 post), which leaves them all on the special-function units: cuDNN's forward is then bound by them at
# 1,605 / 1.3 TFLOP/s ÷ 512 FLOPs per visible score (4 · 128) = 2.4e12 scores/s. A property of the SM (its SFU count
# and clock), so the same on GB200; per score, not per FLOP, so a narrower head (GPT-OSS's 64) is bound by it where
# a head of 128 is not far from the tensor cores' pace. Blackwell Ultra doubles it (:data:`BLACKWELL_ULTRA_EXP_RATE`).
BLACKWELL_EXP_RATE = 1605e12 / 1.3 / (4 * 128)
# Transformer Engine's GEMM profiling tutorial (docs/examples/gemm_profiling/gemm_profiling.rst, PR 2863, 2026)
# times a transformer layer's 12 GEMMs — fprop (M, K, N), dgrad (M, N, K), wgrad (K, M, N) of QKV, attention out, MLP
# up and down at M = 15,872 tokens, hidden 4,096, MLP 16,384 — on a B300 (8 TB/s), ms per pass with inputs quantized
# beforehand (fprop, dgrad, wgrad), and the layer in autocast (the casts te.Linear runs included):
TE_B300_PREQUANTIZED_MS = {"bf16": (4.250, 4.434, 4.418), "current": (2.158, 2.329, 2.325), "mx": (2.365, 2.397, 2.400)}
TE_B300_AUTOCAST_MS = {"current": 9.147, "mx": 8.984}
# MXFP8 GEMMs (Strategy.fp8_recipe="mx"; block-scaled: an E8M0 scale per 32 elements of each operand, applied by the
# tensor cores) run below per-tensor FP8 ones: fprop 2.158 / 2.365 ms (7.161 / 6.812 over the layer). A kernel
# property taken for every Blackwell part (the casts are priced by their bytes apart: ops.fp8_cast_bytes)
MXFP8_GEMM_RATIO = TE_B300_PREQUANTIZED_MS["current"][0] / TE_B300_PREQUANTIZED_MS["mx"][0]
# ... and on Blackwell a backward GEMM runs slower than the forward one of the same size: the dgrad and wgrad passes
# take 1.04× the fprop's time in BF16, 1.08× with per-tensor FP8 (no transposed copy: the GEMM reads its operands in
# the non-TN layouts) and 1.01× with MXFP8 (copies laid out for each GEMM). Not so on Hopper: the tutorial's H200 NVL
# takes 1.00× (BF16 10.632 / 10.747 / 10.530 ms, FP8 current 5.577 / 5.661 / 5.547), so Hopper has no such factor.
# Keyed by the GEMM's dtype, "mx" for MXFP8 (Hardware.backward_gemm_factor, layer.gemm_parts)
BLACKWELL_BACKWARD_GEMM = {k: (d + w) / 2 / f for k, (f, d, w) in TE_B300_PREQUANTIZED_MS.items()}
BLACKWELL_BACKWARD_GEMM["fp8"] = BLACKWELL_BACKWARD_GEMM.pop("current")
BLACKWELL_BACKWARD_GEMM["fp16"] = BLACKWELL_BACKWARD_GEMM["bf16"]


def _te_cast_efficiency(hbm: float, overhead_ms: dict, transpose: bool) -> float:
    """The fraction of ``hbm`` Transformer Engine's FP8 casts reached in its GEMM profiling tutorial (the source of
    :data:`MXFP8_GEMM_RATIO`): per recipe, a layer's autocast time less its pre-quantized time (``overhead_ms``) is
    the casts te.Linear runs before its 12 GEMMs — the input (M × K) and the weight (K × N) of each of the fprop
    (M, K, N), dgrad (M, N, K) and wgrad (K, M, N) shapes, both usages as in training — at the recipe's bytes per
    element (ops.fp8_cast_bytes); the mean over the recipes."""
    from .ops import fp8_cast_bytes

    m, h, i = 15872, 4096, 16384
    shapes = [(m, h, 3 * h), (m, h, h), (m, h, i), (m, i, h)]  # fprop: QKV, out, up, down
    shapes += [(a, c, b) for a, b, c in shapes[:4]] + [(b, a, c) for a, b, c in shapes[:4]]  # dgrad, wgrad
    elements = sum(a * b + b * c for a, b, c in shapes)
    rates = [elements * fp8_cast_bytes(r, 2, transpose) / (ms / 1e3) for r, ms in overhead_ms.items()]
    return sum(rates) / len(rates) / hbm


# On the B300: per layer, current scaling 9.147 - 6.812 ms, MXFP8 8.984 - 7.162 ms: 5.3 and 5.5 TB/s, 0.68 of
# the HBM, where a plain memory-bound kernel of these sizes reaches Calculon's 0.9. Not a property of the casts
# alone: the same tutorial's H200 NVL (4.8 TB/s, Hopper: a transposed copy too) gives 20.285 - 16.785 ms for current
# scaling, 0.89 — Calculon's figure (test_sim_blackwell_casts.py), so Hopper keeps the table
BLACKWELL_CAST_EFFICIENCY = _te_cast_efficiency(
    8e12, {r: TE_B300_AUTOCAST_MS[r] - sum(TE_B300_PREQUANTIZED_MS[r]) for r in TE_B300_AUTOCAST_MS}, False
)
BLACKWELL_ULTRA_EXP_RATE = 2 * BLACKWELL_EXP_RATE
NVLINK5_BUSBW = 800e9  # B/s ring bus bandwidth (see the module docstring)
NDR_NIC, XDR_NIC = 47e9, 94e9  # B/s per GPU: ConnectX-7 400 Gb/s measured; ConnectX-8 800 Gb/s assumed 2x


# GPU <-> host memory, each way (activation offloading, simlib.sim.offload): an x86 DGX's PCIe Gen5 x16 line rate
# (64 GB/s); a Grace superchip's NVLink-C2C, 900 GB/s both ways between one Grace and its two Blackwell GPUs
# (NVIDIA GB200 NVL72 / GB300 NVL72 datasheets), so 225 GB/s each way for one GPU while both copy (an assumption:
# the split between the two GPUs is not published; Grace's LPDDR5X, up to 512 GB/s, does not bind below that)
PCIE5_X16, GRACE_C2C_PER_GPU = 64e9, 900e9 / 2 / 2


def _blackwell(
    name, peaks, memory_gb, devices_per_node, nic, source, exp_rate=BLACKWELL_EXP_RATE, host_link=PCIE5_X16
) -> Hardware:
    h200 = Link.from_busbw(AZURE_H200_ALLREDUCE, 8)
    return Hardware(
        name=name,
        peak_flops=peaks,
        memory_bytes=memory_gb * GiB,
        memory_bandwidth=8.0e12,
        attention_efficiency=BLACKWELL_ATTENTION,
        exp_rate=exp_rate,
        host_link=host_link,
        intra=Link(h200.alpha, NVLINK5_BUSBW, {}, "NVLink 5: ~800 GB/s ring busbw (nccl #1807, Azure guide #7)"),
        inter=Link(5e-6, nic, {}, f"{nic / 1e9:.0f} GB/s per GPU NIC; α assumed"),
        devices_per_node=devices_per_node,
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        fp8_transpose=False,
        cast_efficiency=BLACKWELL_CAST_EFFICIENCY,  # TE: every FP8 layout; casts as measured
        backward_gemm_factor=BLACKWELL_BACKWARD_GEMM,
        gemm_table={
            "bf16": B200_BF16_EFFICIENCY,
            "fp16": B200_BF16_EFFICIENCY,
            "fp8": B200_FP8_EFFICIENCY,
            "fp4": B200_FP4_EFFICIENCY,
        },
        source=source,
    )


def dgx_b200() -> Hardware:
    """DGX B200: 8 B200 (1,000 W) per node on NVLink 5, 180 GB HBM3e each, one 400 Gb/s NIC per GPU."""
    return _blackwell(
        "DGX B200",
        {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "fp4": 9e15, "tf32": 1.1e15, "fp32": 80e12},
        179,
        8,
        NDR_NIC,
        "NVIDIA DGX B200 datasheet (via glennklockwood.com); nccl #1807; pytorch/ao PR 2427",
    )


def gb200_nvl72() -> Hardware:
    """GB200 NVL72: 72 B200 (1,200 W) in one NVLink domain (18 trays of 4), 186 GB HBM3e each, one ConnectX-7
    400 Gb/s NIC per GPU between racks. ``devices_per_node`` is the NVLink domain: a tensor-, context- or
    expert-parallel group of up to 72 stays on NVLink."""
    return _blackwell(
        "GB200 NVL72",
        {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15, "fp4": 10e15, "tf32": 1.25e15, "fp32": 90e12},
        185,
        72,
        NDR_NIC,
        "NVIDIA GB200 NVL72 datasheet (via glennklockwood.com); MLPerf GB200-186GB; Azure guide #7",
        host_link=GRACE_C2C_PER_GPU,
    )


def dgx_b300(nvl72: bool = False) -> Hardware:
    """B300 (Blackwell Ultra): 288 GB HBM3e, FP4 15 PFLOP/s dense, one ConnectX-8 800 Gb/s NIC per GPU; 8 per
    NVLink domain (HGX/DGX B300), or 72 with ``nvl72=True`` (GB300 NVL72)."""
    return _blackwell(
        "GB300 NVL72" if nvl72 else "DGX B300",
        {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15, "fp4": 15e15, "tf32": 1.25e15, "fp32": 90e12},
        268,
        72 if nvl72 else 8,
        XDR_NIC,
        "NVIDIA Blackwell Ultra (GTC 2025) announcement; peaks partly assumed (module docstring)",
        exp_rate=BLACKWELL_ULTRA_EXP_RATE,
        host_link=GRACE_C2C_PER_GPU if nvl72 else PCIE5_X16,
    )


# the names ``sim.preset`` knows (hardware_presets.PRESETS is the one registry)
PRESETS.update({"b200": dgx_b200, "gb200": gb200_nvl72, "b300": dgx_b300, "gb300": lambda: dgx_b300(nvl72=True)})


# ───────────── power-capped and memory-variant Hopper parts (H100 PCIe, H100 NVL) ─────────────
# NVIDIA H100 datasheet, dense = half the sparse figures it prints: H100 PCIe (80 GB HBM2e, 2.0 TB/s, 300-350 W)
# BF16 756 TFLOP/s, FP8 1,513; H100 NVL (94 GB HBM3, 3.9 TB/s, 350-400 W) BF16 835, FP8 1,671 — the lower board
# power is in these peaks (lower sustained clocks). Links: PCIe Gen5 x16 between cards (~50 GB/s of bus bandwidth
# assumed, 64 GB/s line rate each way); an NVL pair's NVLink bridge (600 GB/s both ways) is not modelled (a node
# of 8 is priced on PCIe). GEMMs: the SXM part's measured fraction of peak (an assumption: the power cap may lower it
# further). The 500 W H100 with 96 GB HBM2e of torchtitan's table has no published peak: it stays inexpressible.


def _hopper_variant(name, bf16, fp8, memory_gib, hbm, source) -> Hardware:
    return Hardware(
        name=name,
        peak_flops={"bf16": bf16, "fp16": bf16, "fp8": fp8, "fp32": bf16 / 14.8},  # fp32 ≈ as SXM's ratio
        memory_bytes=memory_gib * GiB,
        memory_bandwidth=hbm,
        attention_efficiency=H100_FLASH_ATTENTION,
        intra=Link(10e-6, 50e9, {}, "PCIe Gen5 x16: ~50 GB/s bus bandwidth assumed (64 GB/s line rate)"),
        inter=Link(5e-6, 47e9, {}, "NDR 400 Gb/s per GPU (nccl-tests #290); α assumed"),
        devices_per_node=8,
        gemm_table={"bf16": H100_GEMM_EFFICIENCY, "fp8": H100_FP8_GEMM_EFFICIENCY},
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source=source,
    )


def h100_pcie() -> Hardware:
    """H100 PCIe: 80 GB HBM2e at 2.0 TB/s, 756 TFLOP/s bf16 dense (NVIDIA H100 datasheet); 8 cards on PCIe."""
    return _hopper_variant("H100 PCIe (8 per node)", 756e12, 1513e12, 80, 2.0e12, "NVIDIA H100 datasheet (PCIe)")


def h100_nvl() -> Hardware:
    """H100 NVL: 94 GB HBM3 at 3.9 TB/s, 835 TFLOP/s bf16 dense (NVIDIA H100 datasheet); 8 cards on PCIe."""
    return _hopper_variant("H100 NVL (8 per node)", 835e12, 1671e12, 94, 3.9e12, "NVIDIA H100 datasheet (NVL)")


PRESETS.update({"h100-pcie": h100_pcie, "h100-nvl": h100_nvl})
