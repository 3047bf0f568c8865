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
GiB = 2**30


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


# What an InfiniBand NIC's collectives reach of its line rate: ~47 GB/s measured by nccl-tests on NDR 400 Gb/s
# (50 GB/s line rate; nccl-tests issue 290), the same figure the presets' inter-node link uses
NIC_EFFICIENCY = 47 / 50
# Ports of one InfiniBand switch (NVIDIA Quantum-2 QM9700: 64 ports of 400 Gb/s): a SHARP reduction tree over N
# nodes is ⌈log_64 N⌉ switch levels deep
SWITCH_RADIX = 64


@dataclass(frozen=True)
class Hardware:
    """One kind of device and how devices are wired.

    ``gemm_table``: {dtype: [(GEMM GFLOPs, efficiency)]} against ``peak_flops[dtype]`` (GPUs), or, for a
    CPU box calibrated here, {(processes, threads): [(GEMM GFLOPs, achieved FLOP/s)]} with ``peak_flops`` empty.
    ``memory_bandwidth`` feeds element-wise work (activations, optimizer) — {processes: B/s} or one number.
    """

    name: str
    peak_flops: dict  # dtype -> FLOP/s per device
    memory_bytes: float  # capacity per device
    memory_bandwidth: object  # B/s per device (float), or {processes per node: B/s per process}
    intra: Link  # inside a node
    inter: Link  # between nodes
    devices_per_node: int
    gemm_table: dict
    cores: int | None = None  # CPU boxes: cores shared by the processes of a node
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
    # (kernel: "flash" = FlashAttention-2, "flash1" = FlashAttention-1 / Triton, "cudnn" = cuDNN's fused attention,
    # Transformer Engine's on Hopper+; none given: FlashAttention-2's); None: the large-GEMM rate
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

    # ── the fabric between nodes, the cluster's own (defaults: one NIC per device, non-blocking, no SHARP) ──
    # NICs a node has for its devices (0: one per device, the DGX rail-optimised layout). All of a node's devices
    # talk at once in a data-parallel sync, so each gets ``inter.bandwidth`` × min(1, nics / devices)
    nics_per_node: int = 0
    # full-bisection pods of this many nodes, joined above by links tapered ``oversubscription``:1 (Llama 3's
    # cluster: 3,072 GPUs a pod, 1:7 between pods; Dubey et al. 2024 §3.3.1). 0 / 1.0: non-blocking throughout
    nodes_per_pod: int = 0
    oversubscription: float = 1.0
    # in-network reduction between nodes (InfiniBand SHARP: the switches add the data up, NCCL's CollNet): an
    # all-reduce sends and receives each byte once, through a tree of switches (:data:`SWITCH_RADIX` ports)
    in_network_reduction: bool = False

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
        if self.nics_per_node < 0 or self.nodes_per_pod < 0 or self.oversubscription < 1:
            raise ValueError(
                f"{self.name}: nics_per_node and nodes_per_pod must be >= 0 and oversubscription >= 1, got "
                f"{self.nics_per_node}, {self.nodes_per_pod}, {self.oversubscription}"
            )
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

    def nic_share(self) -> float:
        """The fraction of ``inter.bandwidth`` each device gets when every device of a node talks at once."""
        nics = self.nics_per_node or self.devices_per_node
        return min(1.0, nics / self.devices_per_node)

    def with_fabric(
        self,
        nic_gbps: float | None = None,
        nics_per_node: int | None = None,
        nodes_per_pod: int | None = None,
        oversubscription: float | None = None,
        in_network_reduction: bool | None = None,
    ) -> Hardware:
        """This machine on another fabric: NICs of ``nic_gbps`` Gb/s line rate (priced at
        :data:`NIC_EFFICIENCY` of it, as nccl-tests measures an NDR NIC), their number per node, full-bisection
        pods and the taper between them, in-network reduction. What is not given stays as it is."""
        changes = {}
        if nic_gbps is not None:
            if nic_gbps <= 0:
                raise ValueError(f"nic_gbps must be > 0, got {nic_gbps!r}")
            bw = nic_gbps / 8 * 1e9 * NIC_EFFICIENCY
            changes["inter"] = replace(
                self.inter, bandwidth=bw, by_world={}, source=f"{nic_gbps:g} Gb/s NIC × {NIC_EFFICIENCY}"
            )
        for name, value in (
            ("nics_per_node", nics_per_node),
            ("nodes_per_pod", nodes_per_pod),
            ("oversubscription", oversubscription),
            ("in_network_reduction", in_network_reduction),
        ):
            if value is not None:
                changes[name] = value
        return replace(self, **changes)

    def with_(self, **changes) -> Hardware:
        return replace(self, **changes)
