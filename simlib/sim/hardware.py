"""What a machine can do: GEMM throughput against GEMM size, memory, and links (latency α, bandwidth).

Links are modelled with *measured* bus bandwidth and a fitted latency, not line rate: nccl-tests reports bus
bandwidth = algorithm bandwidth × factor (all-reduce 2(n−1)/n, all-gather / reduce-scatter (n−1)/n), so a fit of
``t = 2(n−1)·α + 2(n−1)/n · S / B`` to an all-reduce sweep gives α and B directly (nccl-tests, doc/PERFORMANCE.md).

GEMM throughput depends on the GEMM's size (Calculon, Isaev et al. SC'23, keeps a table of efficiency against
GEMM GFLOPs; we take the same idea): small layers run far below peak. :func:`calibrate` measures that table here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

GB = 1e9
# an "80 GB" GPU has 80 GiB of HBM (nvidia-smi: 81920 MiB on an A100 80GB, 40960 MiB on a 40GB): capacity is in GiB
GiB = 2 ** 30


def interpolate(table, x: float) -> float:
    """Piecewise-linear in log(x) through ``table`` = [(x, y), ...]; flat beyond the ends."""
    xs, ys = _points(tuple((a, b) for a, b in table))
    return float(np.interp(math.log(max(x, 1e-30)), xs, ys))


@lru_cache(maxsize=1024)
def _points(table: tuple):
    """A table's sorted (log x, y) points, prepared once per table (the planner interpolates millions of times)."""
    pts = sorted((float(a), float(b)) for a, b in table)
    if not pts:
        raise ValueError("empty table")
    return np.log(np.maximum([p[0] for p in pts], 1e-30)), [p[1] for p in pts]


def fit_alpha_beta(sizes, times, world_size: int):
    """Fit a ring all-reduce ``t = 2(n−1)·α + 2(n−1)/n · S / B`` to measured (bytes, seconds).

    Least squares on the *relative* error (each point weighted 1/t), so 1 KB and 16 MB count alike.
    Returns (α seconds per step, B bytes/s bus bandwidth).
    """
    n = int(world_size)
    if n < 2:
        raise ValueError("an all-reduce fit needs world_size >= 2")
    s = np.asarray(sizes, float)
    t = np.asarray(times, float)
    if len(s) < 2 or len(s) != len(t) or (t <= 0).any() or (s < 0).any():
        raise ValueError("need >= 2 (size >= 0, time > 0) pairs of equal length")
    steps, bus = 2 * (n - 1), 2 * (n - 1) / n
    design = np.stack([np.full_like(s, steps), s * bus], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if inv_bw <= 0:  # latency-bound everywhere: fall back to the largest size for bandwidth
        inv_bw = t.max() / max(s.max() * bus, 1.0)
    return max(float(alpha), 0.0), float(1.0 / inv_bw)


def fit_p2p(sizes, times):
    """Fit a point-to-point message ``t = α + S / B`` to measured one-way (bytes, seconds); relative least squares
    as :func:`fit_alpha_beta`. Returns (α seconds per message, B bytes/s)."""
    s = np.asarray(sizes, float)
    t = np.asarray(times, float)
    if len(s) < 2 or len(s) != len(t) or (t <= 0).any() or (s < 0).any():
        raise ValueError("need >= 2 (size >= 0, time > 0) pairs of equal length")
    design = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if inv_bw <= 0:
        inv_bw = t.max() / max(s.max(), 1.0)
    return max(float(alpha), 0.0), float(1.0 / inv_bw)


@dataclass(frozen=True)
class Link:
    """A link class (inside a node or between nodes): per-step latency ``alpha`` (s) and bus ``bandwidth`` (B/s).

    ``by_world``: measured (α, B) per world size, used when a collective spans exactly that many ranks
    (Gloo's cost per step changes with the number of processes sharing two cores).
    """

    alpha: float
    bandwidth: float
    by_world: dict = field(default_factory=dict)
    source: str = ""
    measured: dict = field(default_factory=dict)  # {world_size: [(bytes, seconds)]} all-reduce times measured
    # published nccl-tests bus bandwidth by message size, ((bytes, B/s), ...): where present, a collective's time
    # is its bus-bandwidth factor × S / busbw(S) read off this curve (see :meth:`bus_bandwidth`)
    busbw_points: tuple = ()

    def bus_bandwidth(self, size: float):
        """Bus bandwidth (B/s) for a ``size``-byte message, read off the published curve, or None without one.

        Between published sizes: linear in log(size); above the largest: flat (the link is saturated). Below the
        smallest size a message is latency-bound, so its *time* stays that of the smallest size: the bandwidth
        returned falls in proportion to the size.
        """
        if not self.busbw_points:
            return None
        pts = sorted(self.busbw_points)
        smallest, bw_small = pts[0]
        if size < smallest:
            return bw_small * max(size, 1.0) / smallest
        return interpolate(pts, size)

    def all_reduce_time(self, size: float, world_size: int):
        """The measured all-reduce time for ``size`` bytes (log-log interpolation), or None if not measured.

        Gloo on a shared box is not α-β shaped (a 1 MB all-reduce can beat a 64 KB one), so where we have the
        curve the cost model uses it; beyond its ends it extrapolates with the α-β fit's bandwidth.
        """
        curve = self.measured.get(int(world_size))
        if not curve:
            return None
        pts = sorted(curve)
        sizes, times = [p[0] for p in pts], [p[1] for p in pts]
        if size > sizes[-1]:
            _, bw = self.at(world_size)
            return times[-1] + 2 * (world_size - 1) / world_size * (size - sizes[-1]) / bw
        if size <= sizes[0]:
            return times[0]
        return float(np.exp(np.interp(np.log(size), np.log(sizes), np.log(times))))

    def __post_init__(self):
        if self.alpha < 0 or self.bandwidth <= 0:
            raise ValueError(f"a link needs alpha >= 0 and bandwidth > 0, got {self.alpha}, {self.bandwidth}")

    def at(self, world_size: int):
        """(α, B) for a collective over ``world_size`` ranks: measured if we have it, else the default."""
        return self.by_world.get(int(world_size), (self.alpha, self.bandwidth))

    @classmethod
    def from_busbw(cls, points, world_size: int, source: str = "", keep_curve: bool = False) -> Link:
        """A link from published all-reduce points [(bytes, bus GB/s), ...] (nccl-tests output).

        α and B are a fit through the points; ``keep_curve`` also keeps the points themselves, so that a
        collective of any size is priced at the bus bandwidth measured for that size (a straight α-β line
        through 1 MB .. 1 GB misses the large sizes by ~15 %: NCCL changes protocol and algorithm with size).
        """
        n = world_size
        sizes = [p[0] for p in points]
        times = [p[0] * 2 * (n - 1) / n / (p[1] * GB) for p in points]
        alpha, bw = fit_alpha_beta(sizes, times, n)
        curve = tuple((float(a), float(b) * GB) for a, b in points) if keep_curve else ()
        return cls(alpha, bw, {}, source, busbw_points=curve)


@dataclass(frozen=True)
class Hardware:
    """One kind of device and how devices are wired.

    ``gemm_table``: {dtype: [(GEMM GFLOPs, efficiency)]} against ``peak_flops[dtype]`` (GPUs), or, for a
    CPU box calibrated here, {(processes, threads): [(GEMM GFLOPs, achieved FLOP/s)]} with ``peak_flops`` empty.
    ``memory_bandwidth`` feeds element-wise work (activations, optimizer) — {processes: B/s} or one number.
    """

    name: str
    peak_flops: dict             # dtype -> FLOP/s per device
    memory_bytes: float          # capacity per device
    memory_bandwidth: object     # B/s per device (float), or {processes per node: B/s per process}
    intra: Link                  # inside a node
    inter: Link                  # between nodes
    devices_per_node: int
    gemm_table: dict
    cores: int | None = None     # CPU boxes: cores shared by the processes of a node
    source: str = ""
    measurements: object = None  # calibrate(): the raw numbers behind the tables
    # achievable fraction of ``memory_bandwidth`` against the bytes one kernel moves, [(MB, efficiency)]
    # (GPU presets: Calculon's table); None: the full bandwidth for every size (CPU boxes measure theirs)
    mem_efficiency: object = None
    # how a GEMM's math and its own memory traffic combine: "roofline" (the longer of the two: loads hidden
    # behind math) or "no_overlap" (their sum: Calculon's processing_mode, the one its A100/H100 files use)
    processing: str = "roofline"
    # calibrate(): measured terms of a real multi-process CPU step (empty for presets: no such terms):
    # {"straggler": {w: f}, "layer_factor": {(w, threads): f}, "comm_in_situ": {w: f},
    #  "accumulate_grad_Bps": {w: B/s}, "gemm_shapes": {(w, threads): {(m, k, n): FLOP/s}}, "p2p": (α, B)}
    overheads: dict = field(default_factory=dict)
    # fused attention kernels reach these fractions of the 16-bit peak, {kernel: {"forward": f, "backward": b}}
    # (kernel: "flash" = FlashAttention-2, "flash1" = FlashAttention-1 / Triton); None: the large-GEMM rate
    attention_efficiency: dict = None
    # exponentials per second a fused attention kernel's softmax gets through (one per visible score, forward and
    # again in backward's recompute of P) on the special-function units; where the tensor cores outrun them the
    # kernel waits on them (presets.BLACKWELL_EXP_RATE). 0: never the limit
    exp_rate: float = 0.0
    # bytes per second each way between one device and its host's memory (activation offloading,
    # simlib.sim.offload): PCIe, or NVLink-C2C on Grace parts. 0: not stated (offloading cannot be priced)
    host_link: float = 0.0
    # Transformer Engine's FP8 casts here: ``fp8_transpose`` — per-tensor FP8 GEMMs take only the TN layout, so each
    # cast also writes a transposed copy (Hopper; Blackwell takes every layout: presets); ``cast_efficiency`` — the
    # most of the memory bandwidth a cast kernel reaches (0: as any kernel of its size, Calculon's table)
    fp8_transpose: bool = True
    cast_efficiency: float = 0.0
    # a backward (dgrad, wgrad) GEMM's time over a forward one's of the same size, by dtype ("mx": MXFP8); None: 1
    backward_gemm_factor: dict = None

    def _by_world(self, name: str, processes: int, default):
        table = (self.overheads or {}).get(name) or {}
        if not table:
            return default
        if processes in table:
            return table[processes]
        return table[min(table, key=lambda k: abs(k - processes))]

    def own_cores(self, processes: int) -> int | None:
        """A CPU box whose ``processes`` outnumber its cores: how many get a core each (the cores), for the
        processor-sharing step (:mod:`simlib.sim.cpu_share`); None on a GPU or with a core per process."""
        return self.cores if not self.peak_flops and self.cores and processes > self.cores else None

    def straggler(self, processes: int) -> float:
        """Slowest rank's compute time over the mean, ranks side by side (1 for one process or unmeasured)."""
        return 1.0 if processes <= 1 else float(self._by_world("straggler", processes, 1.0))

    def layer_factor(self, processes: int, threads: int | None = None) -> float:
        """Real autograd Linear layers' time over the bare GEMMs' (1 if unmeasured); keyed by (processes,
        threads) like the GEMM table (a plain {processes: f} also works)."""
        table = (self.overheads or {}).get("layer_factor") or {}
        if not table:
            return 1.0
        processes = max(processes, 1)
        if threads is None:
            threads = max(1, (self.cores or 1) // processes)
        for key in ((processes, threads), processes):
            if key in table:
                return float(table[key])
        def distance(k):
            p, t = k if isinstance(k, tuple) else (k, threads)
            return (abs(p - processes), abs(t - threads))
        return float(table[min(table, key=distance)])

    def comm_in_situ(self, processes: int) -> float:
        """An all-reduce right after compute over a back-to-back one (1 if unmeasured)."""
        return 1.0 if processes <= 1 else float(self._by_world("comm_in_situ", processes, 1.0))

    def accumulate_grad_rate(self, processes: int):
        """B/s of ``grad.add_(new)`` on a weight-sized gradient, or None if unmeasured (the term is left out)."""
        return self._by_world("accumulate_grad_Bps", processes, None)

    def p2p_link(self):
        """(α, B) of one point-to-point message, measured by a ping-pong, or None."""
        return (self.overheads or {}).get("p2p")

    def gemm_rate(self, gflops: float, dtype: str = "bf16", processes: int = 1, threads: int | None = None) -> float:
        """Achieved FLOP/s of one GEMM of ``gflops`` GFLOPs on one device (or one process of a CPU box)."""
        if gflops < 0:
            raise ValueError(f"GEMM size must be >= 0 GFLOPs, got {gflops}")
        if self.peak_flops:
            if dtype not in self.peak_flops:
                raise ValueError(f"{self.name} has no {dtype!r} peak; known: {sorted(self.peak_flops)}")
            table = self.gemm_table.get(dtype) or next(iter(self.gemm_table.values()))
            return self.peak_flops[dtype] * interpolate(table, gflops)
        key = self._cpu_key(processes, threads)
        return interpolate(self.gemm_table[key], gflops)

    def gemm_shape_rate(self, m: int, k: int, n: int, processes: int = 1, threads: int | None = None):
        """FLOP/s calibrate() measured for exactly this (m, k, n) GEMM, or None.

        On a CPU the shape matters, not only the FLOPs: a grad-weight GEMM (width × batch × width: a short inner
        dimension) ran at 57-75 GFLOP/s here where a forward one of the same FLOPs ran at 93-97, and the
        GFLOPs-keyed table mixes both at the same x. Exact shapes that were measured win.
        """
        table = (self.overheads or {}).get("gemm_shapes") or {}
        if not table or self.peak_flops:
            return None
        key = self._cpu_key(processes, threads)
        return (table.get(key) or {}).get((int(m), int(k), int(n)))

    def _cpu_key(self, processes: int, threads: int | None):
        if threads is None:
            threads = max(1, (self.cores or 1) // max(processes, 1))
        if (processes, threads) in self.gemm_table:
            return (processes, threads)
        # nearest measured setup: same process count first, then the closest one
        keys = sorted(self.gemm_table, key=lambda k: (abs(k[0] - processes), abs(k[1] - threads)))
        return keys[0]

    def mem_rate(self, processes: int = 1) -> float:
        bw = self.memory_bandwidth
        if isinstance(bw, dict):
            return bw.get(processes) or bw[min(bw, key=lambda k: abs(k - processes))]
        return float(bw)

    def __post_init__(self):
        if self.processing not in ("roofline", "no_overlap"):
            raise ValueError(f"processing must be 'roofline' or 'no_overlap', got {self.processing!r}")

    def achievable_bandwidth(self, nbytes: float, processes: int = 1, fp8_cast: bool = False) -> float:
        """B/s a memory-bound kernel moving ``nbytes`` reaches: the memory bandwidth × the efficiency for that
        size (small kernels do not fill the memory system: Calculon's ``MB_efficiency`` table); an FP8 cast
        (``fp8_cast``) at most ``cast_efficiency`` of the bandwidth where that is set."""
        rate = self.mem_rate(processes)
        eff = interpolate(self.mem_efficiency, max(nbytes, 1.0) / 1e6) if self.mem_efficiency else 1.0
        return rate * (min(eff, self.cast_efficiency) if fp8_cast and self.cast_efficiency else eff)

    def peak(self, dtype: str = "bf16", processes: int = 1) -> float:
        """Peak FLOP/s of one device (CPU box: the best rate calibrated for this process count)."""
        if self.peak_flops:
            return self.peak_flops[dtype]
        key = self._cpu_key(processes, None)
        return max(r for _, r in self.gemm_table[key])

    def with_(self, **changes) -> Hardware:
        return replace(self, **changes)


# ───────────────────────── presets (values and sources) ─────────────────────────

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
H100_FLASH_ATTENTION = {"flash": {"forward": 0.35, "backward": 0.35},
                        "flash1": {"forward": 0.35 * 0.40 / 0.73, "backward": 0.35 * 0.25 / 0.50}}


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
        name=f"DGX A100 {memory_gb}GB", peak_flops={"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
        memory_bytes=memory_gb * GiB, memory_bandwidth=2.039e12 if memory_gb == 80 else 1.555e12,
        attention_efficiency=A100_FLASH_ATTENTION, host_link=32e9,   # PCIe Gen4 x16 to the host, each way
        intra=Link.from_busbw(AZURE_A100_80GB_ALLREDUCE, 8, "Azure nccl-tests, 8x A100-SXM4-80GB", keep_curve=True),
        inter=Link(5e-6, 23e9, {}, "HDR 200 Gb/s per GPU: half of NDR's ~47 GB/s (nccl-tests #290); α assumed"),
        devices_per_node=8, gemm_table={"bf16": A100_GEMM_EFFICIENCY}, mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA A100 datasheet; Azure nccl-tests; Calculon systems/a100_80g.json; "
               "mli/transformers-benchmarks (A100 matmul)")


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
        name="DGX H100" + (" (2023 software)" if software == "2023" else ""), peak_flops={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 67e12},
        memory_bytes=80 * GiB, memory_bandwidth=3.35e12, attention_efficiency=H100_FLASH_ATTENTION,
        host_link=64e9,   # PCIe Gen5 x16 to the host, each way (NVIDIA H100 datasheet: 128 GB/s both ways)
        intra=Link(h200.alpha, 370e9, {}, "ring busbw 370 GB/s (nccl-tests #212); α fitted to Azure H200"),
        inter=Link(5e-6, 47e9, {}, "NDR 400 Gb/s: ~46-48 GB/s per NIC (nccl-tests #290); α assumed"),
        devices_per_node=8, gemm_table={"bf16": table, "fp8": H100_FP8_GEMM_EFFICIENCY},
        mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA H100 datasheet; nccl-tests #212, #290; Azure nccl-tests (H200); Calculon"
               + ("; pytorch/pytorch#100850 (2023 matmul)" if software == "2023" else ""))


def cpu_box() -> Hardware:
    """This course's 2-core box, from the planning numbers in the course notes (measured once, by hand).

    Matmul 1024³ (2.1 GFLOPs): 58 GFLOP/s on 1 thread, 81 on 2; 51 each for two 1-thread processes, 28 each
    for four. Gloo all-reduce ≈ 2 ms per call and ≈ 0.7 GB/s bus bandwidth (2 ranks), 0.6 (4 ranks).
    Small GEMMs are assumed to run at half rate below 0.01 GFLOPs. Prefer :func:`calibrate` for today's numbers.
    """
    def curve(rate):
        return [(0.001, 0.3 * rate), (0.01, 0.6 * rate), (0.1, 0.9 * rate), (2.1, rate)]

    return Hardware(
        name="CPU box (2 cores, notes)", peak_flops={}, memory_bytes=8e9, memory_bandwidth={1: 8e9, 2: 5e9, 4: 2.5e9},
        intra=Link(1e-3, 0.7e9, {2: (1e-3, 0.7e9), 4: (0.4e-3, 0.6e9)}, "course notes: Gloo on loopback"),
        inter=Link(1e-3, 0.1e9, {}, "not measured: one node only"),
        devices_per_node=4, cores=2,
        gemm_table={(1, 1): curve(58e9), (1, 2): curve(81e9), (2, 1): curve(51e9), (4, 1): curve(28e9)},
        source="shared course notes (measured on this box for planning)")


PRESETS = {"cpu": cpu_box, "a100": dgx_a100, "a100-40gb": lambda: dgx_a100(40), "h100": dgx_h100,
           "h100-2023": lambda: dgx_h100("2023")}


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
        name="DGX H200", peak_flops=peak, memory_bytes=139.8 * GiB, memory_bandwidth=4.8e12,
        attention_efficiency=H100_FLASH_ATTENTION, host_link=64e9,   # PCIe Gen5 x16 to the host, each way
        intra=Link.from_busbw(AZURE_H200_ALLREDUCE, 8, "Azure nccl-tests, 8x H200 (NVLink SHARP)", keep_curve=True),
        inter=Link(5e-6, 47e9, {}, "NDR 400 Gb/s: ~46-48 GB/s per NIC (nccl-tests #290); α assumed"),
        devices_per_node=8, gemm_table=table, mem_efficiency=CALCULON_MEM_EFFICIENCY,
        source="NVIDIA H200 datasheet; GEMM and HBM measured on an H200 (benchmarks/results/gpu_check.json); "
               "Azure nccl-tests (H200); nccl-tests #290; Calculon (memory efficiency)")


PRESETS["h200"] = dgx_h200
