"""Lesson 05b, one device's step: where the time goes, fusion and ``torch.compile``, fused attention, bf16, CUDA
graphs, and MFU from eager to compiled -- the same functions on a CPU (inductor's C++ backend, SDPA's CPU
kernels, CPU autocast) and on a GPU; GPU-only parts return ``{"skipped": "<why>"}`` on a CPU.

    step = make_step(config, micro_batch=4, device="cpu")     # the course's GPT, AdamW, one training step
    table = profile_step(step)                                 # torch.profiler: time by category
    rungs = mfu_ladder(config, micro_batch=4, device="cpu")    # eager -> bf16 -> compiled -> fused AdamW
    attention_compare(seq=512, heads=4, head_dim=32)           # naive (T x T scores) vs SDPA: time, memory
    sim_beside_profile(config, micro_batch, table, hardware)   # the simulator's kernel terms beside the profile

MFU is the course's (:mod:`simlib.debug.mfu`): FLOPs per token from the stated formula, over the datasheet's dense
peak on a GPU, or the measured matmul rate on a CPU. Timings are medians after warm-up steps, with the spread.
The GPU check (``benchmarks/gpu_reference.py``) runs :func:`plain_loop` at the GPT's GPU size: the torch reference
the course's own trainer is judged against.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CATEGORIES = ("GEMM", "attention", "element-wise", "optimizer", "other")
_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::linear", "aten::matmul")
_ATTENTION = ("scaled_dot_product", "flash", "fmha", "efficient_attention", "cudnn_attention", "_softmax")
_OPTIMIZER = ("optimizer", "adam", "_foreach", "multi_tensor")  # aten::_fused_adamw_ has "adam"
_GEMM_KERNELS = ("gemm", "xmma", "cutlass", "nvjet", "cublas")  # cuBLAS/CUTLASS kernel names on a GPU


def gpu_available() -> bool:
    return torch.cuda.is_available()


def skipped(why: str) -> dict:
    """What a GPU-only part returns on a CPU: one line saying so (the notebook prints it)."""
    return {"skipped": why}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn, repeats: int = 5, warmup: int = 2, device="cpu") -> dict:
    """Median seconds of ``fn()`` over ``repeats`` after ``warmup`` calls, with the spread (min, max)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "repeats": repeats}


def load() -> str:
    """The machine's load, for the sentence beside every timing."""
    one, five, _ = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


# ---- one training step of the course's GPT ----
@dataclass
class Step:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    device: torch.device
    dtype: str | None  # "bf16" autocast, or None (fp32)
    config: object
    compiled: bool = False
    fused: bool = False

    def __call__(self):
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.dtype == "bf16"):
            logits = self.model(self.x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), self.y.reshape(-1))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    @property
    def tokens(self) -> int:
        return self.x.numel()


def make_step(
    config,
    micro_batch: int,
    device="cpu",
    dtype: str | None = None,
    compile: bool = False,
    fused: bool = False,
    mode: str | None = None,
    seed: int = 0,
) -> Step:
    """The course's GPT (``simlib.projects.gpt.model``) with AdamW, a fixed random batch of ``micro_batch``
    windows. ``compile``: ``torch.compile`` the whole model, or ``"blocks"`` each transformer block (regional
    compilation: one compile for the 12 identical blocks) (``mode``: e.g. ``"reduce-overhead"``, CUDA graphs on a
    GPU); ``fused``: AdamW's fused kernel (one launch for every parameter; CPU too in torch >= 2.4)."""
    from ..projects.gpt.model import GPT

    device = torch.device(device)
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None, foreach=None if fused else True)
    if compile == "blocks":  # regional compilation: each (identical) block compiled once, far shorter than whole
        for block in model.blocks:
            block.compile(mode=mode)
    elif compile:
        model = torch.compile(model, mode=mode)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, config.vocab_size, (micro_batch, config.seq_len), generator=g).to(device)
    y = torch.randint(0, config.vocab_size, (micro_batch, config.seq_len), generator=g).to(device)
    return Step(model, optimizer, x, y, device, dtype, config, compile, fused)


def peak_flops(device, dtype: str | None) -> dict:
    """MFU's yardstick (the course's): the datasheet's dense peak on a GPU, the measured matmul rate on a CPU."""
    from ..debug import mfu

    device = torch.device(device)
    if device.type == "cuda":
        peak = mfu.device_peak(device, dtype)
        return {"peak": peak["peak"], "source": peak["text"]}
    dtypes = ("float32", "bfloat16") if dtype == "bf16" else ("float32",)
    best = mfu.measured_peak(device, dtypes, size=512, repeats=5)
    return {"peak": best, "source": f"measured: the best of 5 512^3 matmuls in {'/'.join(dtypes)} here"}


def measure(step: Step, repeats: int = 5, warmup: int = 2, peak: dict | None = None) -> dict:
    """A step's median time, tokens/s and MFU (FLOPs per token from ``simlib.debug.mfu.flops_per_token``)."""
    from ..debug import mfu

    t = median_time(step, repeats, warmup, step.device)
    flops = mfu.flops_per_token(step.config)["total"] * step.tokens
    peak = peak or peak_flops(step.device, step.dtype)
    return {
        "step_s": t["median"],
        "step_min_s": t["min"],
        "step_max_s": t["max"],
        "tokens_per_s": step.tokens / t["median"],
        "model_flops_per_s": flops / t["median"],
        "mfu": flops / t["median"] / peak["peak"],
        "peak_flops": peak["peak"],
        "peak_source": peak["source"],
    }


RUNGS = (
    ("eager fp32", dict()),
    ("eager bf16 autocast", dict(dtype="bf16")),
    ("compiled bf16", dict(dtype="bf16", compile=True)),
    ("compiled bf16 + fused AdamW", dict(dtype="bf16", compile=True, fused=True)),
)
QUICK_RUNGS = RUNGS[:2] + (("eager bf16 + fused AdamW", dict(dtype="bf16", fused=True)),)  # no compile: minutes here
GPU_RUNGS = (("+ CUDA graphs (reduce-overhead)", dict(dtype="bf16", compile=True, fused=True, mode="reduce-overhead")),)


def mfu_ladder(config, micro_batch: int, device="cpu", repeats: int = 5, warmup: int = 2, rungs=None) -> list[dict]:
    """MFU step by step: each rung one more switch (:data:`RUNGS`; on a GPU also :data:`GPU_RUNGS`). One row per
    rung: name, step time (median, min, max), tokens/s, MFU; compile time is in the warm-up, not the timing."""
    device = torch.device(device)
    if rungs is None:
        rungs = RUNGS + (GPU_RUNGS if device.type == "cuda" else ())
    rows = []
    peaks = {}
    for name, switches in rungs:
        dtype = switches.get("dtype")
        peaks.setdefault(dtype, peak_flops(device, dtype))
        step = make_step(config, micro_batch, device, **switches)
        t0 = time.perf_counter()
        step()  # the first call compiles
        _sync(device)
        first = time.perf_counter() - t0
        row = {"rung": name, "first_step_s": first, **measure(step, repeats, warmup, peaks[dtype])}
        rows.append(row)
        del step
    return rows


# ---- where the time goes ----
def categorize(name: str) -> str:
    """The category of a profiler event: GEMM, attention, element-wise, optimizer or other."""
    low = name.lower()
    if any(k in low for k in _OPTIMIZER):
        return "optimizer"
    if any(k in low for k in _ATTENTION):
        return "attention"
    if name in _GEMM or any(k in low for k in _GEMM_KERNELS) or low.startswith(("aten::mm", "aten::addmm")):
        return "GEMM"
    if name.startswith("aten::") or "triton" in low or "kernel" in low or "cpp_fused" in low:
        return "element-wise"
    return "other"


def _category(ev) -> str:
    """An event's category; on a CPU, an operator called inside ``Optimizer.step`` (AdamW's sqrt, mul, add) is
    the optimizer's, whatever its name."""
    parent = getattr(ev, "cpu_parent", None)
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return "optimizer"
        parent = parent.cpu_parent
    return categorize(ev.name)


def profile_step(step: Step, steps: int = 3, warmup: int = 2) -> dict:
    """torch.profiler over ``steps`` training steps (after ``warmup``): self time by category per step and the
    gaps (the step's wall time not covered by any operator's self time: launch and Python overhead, waits).
    On a GPU the device's kernel time is used; on a CPU the operators' self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    _sync(step.device)
    cuda = step.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(step.device)
        wall = (time.perf_counter() - t0) / steps
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    by_op = {}
    for ev in prof.events():
        if cuda and ev.device_type != torch.autograd.DeviceType.CUDA:
            continue  # on a GPU the kernels themselves (an operator's own row would count its kernels twice)
        self_us = ev.self_device_time_total if cuda else ev.self_cpu_time_total
        if self_us <= 0 or ev.name.startswith("ProfilerStep"):
            continue
        cat = _category(ev)
        by_cat[cat] += self_us / 1e6 / steps
        row = by_op.setdefault((ev.name, cat), {"op": ev.name, "category": cat, "seconds": 0.0, "calls": 0})
        row["seconds"] += self_us / 1e6 / steps
        row["calls"] += 1
    top = sorted(by_op.values(), key=lambda r: -r["seconds"])
    for row in top:
        row["calls"] //= steps
    busy = sum(by_cat.values())
    top.sort(key=lambda r: -r["seconds"])
    return {
        "wall_s": wall,
        "by_category": by_cat,
        "gaps_s": max(wall - busy, 0.0),
        "busy_s": busy,
        "top": top[:12],
        "clock": "device kernels" if cuda else "CPU operators' self time",
    }


# ---- operator fusion ----
def gelu_chain(x, w, b):
    """A transformer's element-wise tail as eager PyTorch runs it: bias, GELU, gate, residual -- four kernels,
    each reading and writing the whole tensor."""
    return F.gelu(x * w + b) * torch.sigmoid(x) + x


def count_kernels(fn, *args, device="cpu") -> dict:
    """The operators (CPU) or kernels (GPU) one call of ``fn`` launches, from torch.profiler: how many, and
    their names."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn(*args)
        _sync(device)
    names = []
    for ev in prof.events():
        parent = ev.cpu_parent.name if ev.cpu_parent is not None else ""
        if cuda:
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                names.append(ev.name)
        elif "CompiledFxGraph" in ev.name:  # inductor's compiled graph: its fused C++ loops run inside this call
            names.append("inductor fused graph")
        elif ev.name.startswith("aten::") and not parent.startswith("aten::"):  # an operator, not its sub-calls
            names.append(ev.name)
    return {"count": len(names), "names": names}


def fusion_demo(rows: int = 512, cols: int = 512, device="cpu", repeats: int = 5) -> dict:
    """:func:`gelu_chain` eager against ``torch.compile``'s fused version (inductor: one C++/OpenMP loop on a CPU,
    one Triton kernel on a GPU): equal outputs, kernels launched by each, median time of each. The compile time
    (the first call) is reported apart."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(device)
    w, b = torch.randn(cols, generator=g).to(device), torch.randn(cols, generator=g).to(device)
    compiled = torch.compile(gelu_chain)
    t0 = time.perf_counter()
    out = compiled(x, w, b)
    _sync(device)
    compile_s = time.perf_counter() - t0
    return {
        "max_abs_diff": float((out - gelu_chain(x, w, b)).abs().max()),
        "compile_s": compile_s,
        "eager": {
            **count_kernels(gelu_chain, x, w, b, device=device),
            "seconds": median_time(lambda: gelu_chain(x, w, b), repeats, 1, device)["median"],
        },
        "compiled": {
            **count_kernels(compiled, x, w, b, device=device),
            "seconds": median_time(lambda: compiled(x, w, b), repeats, 1, device)["median"],
        },
        "bytes_per_pass": x.numel() * x.element_size(),
    }


# ---- fused attention against the textbook ----
def naive_attention(q, k, v, causal: bool = True):
    """Attention as written on the board: the full (T x T) score matrix, softmax, then mixing with v."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ v


def peak_bytes(fn, device="cpu") -> int:
    """Peak bytes ``fn()`` allocated above what was live when it started (CUDA's counter, or the profiler's
    allocation records on a CPU: ``simlib.parallel.accumulate.peak_memory``)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from ..parallel.accumulate import peak_memory

    return peak_memory(fn)


def attention_compare(
    seq: int = 512, heads: int = 4, head_dim: int = 32, batch: int = 1, device="cpu", dtype=torch.float32, repeats=5
) -> dict:
    """Naive attention against ``F.scaled_dot_product_attention`` (causal): equal outputs, each one's median time
    and peak memory, and the bytes of the score matrix the naive one materialises (batch x heads x T x T)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=g).to(device, dtype) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = naive_attention(q, k, v)
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    return {
        "max_abs_diff": float((out.float() - ref.float()).abs().max()),
        "tolerance": tol,
        "naive_s": median_time(lambda: naive_attention(q, k, v), repeats, 1, device)["median"],
        "sdpa_s": median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats, 1, device)[
            "median"
        ],
        "naive_peak_bytes": peak_bytes(lambda: naive_attention(q, k, v), device),
        "sdpa_peak_bytes": peak_bytes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device),
        "score_matrix_bytes": batch * heads * seq * seq * q.element_size(),
        "output_bytes": q.numel() * q.element_size(),
    }


# ---- the simulator's kernel terms beside the profile ----
def sim_beside_profile(config, micro_batch: int, profiled: dict, hardware, dtype: str = "bf16") -> dict:
    """The simulator's operators of one step (``sim.operator_table``: one layer x layers, for ``micro_batch``
    windows) summed into the profiler's categories, beside what the profiler measured, per category (seconds)."""
    from .. import sim
    from ..sim.strategy import Strategy

    model = sim.gpt(
        config.num_layers, config.hidden, config.num_heads, config.seq_len, config.vocab_size, name="this GPT"
    )
    strategy = Strategy(micro_batch=micro_batch, dtype=dtype)
    table = sim.operator_table(model, hardware, strategy)
    predicted = dict.fromkeys(CATEGORIES, 0.0)
    for _, row in table.iterrows():
        kind = row.get("kind", "")
        cat = "GEMM" if kind == "gemm" else "attention" if kind == "attention" else "element-wise"
        predicted[cat] += row["ms"] / 1e3 * config.num_layers
    pred_step = sim.predict(model, hardware, strategy)
    predicted["optimizer"] = getattr(pred_step, "optimizer", 0.0) or 0.0
    return {
        "hardware": hardware.name,
        "predicted": predicted,
        "measured": profiled["by_category"],
        "predicted_step_s": pred_step.step_time,
        "measured_step_s": profiled["wall_s"],
    }


# ---- GPU only: FP8 GEMMs and CUDA graphs ----
def fp8_gemm(size: int = 8192, device="cuda") -> dict:
    """An FP8 (e4m3) GEMM's TFLOP/s beside bf16's, through ``torch._scaled_mm`` (Hopper and later: compute
    capability >= 8.9); torchao's float8 training (``convert_to_float8_training``) where it is installed."""
    device = torch.device(device)
    if device.type != "cuda":
        return skipped("FP8 GEMMs need an NVIDIA GPU with compute capability >= 8.9 (H100, L4, B200): none here")
    if torch.cuda.get_device_capability(device) < (8, 9):
        return skipped(f"{torch.cuda.get_device_name(device)} has no FP8 tensor cores (compute capability < 8.9)")
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.tensor(1.0, device=device)
    fp8 = median_time(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 10, 3, device)
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16 = median_time(lambda: a16 @ b16, 10, 3, device)
    flops = 2 * size**3
    out = {"size": size, "fp8_tflops": flops / fp8["median"] / 1e12, "bf16_tflops": flops / bf16["median"] / 1e12}
    try:
        import torchao  # noqa: F401

        out["torchao"] = "installed: torchao.float8.convert_to_float8_training converts a model's Linears"
    except ImportError:
        out["torchao"] = "not installed (pip install torchao): the GEMM above is torch's own _scaled_mm"
    return out


def cuda_graph_step(config, micro_batch: int, device="cuda", repeats: int = 10) -> dict:
    """A compiled bf16 step with and without CUDA graphs (``torch.compile(mode="reduce-overhead")``): on a small
    model the launches, not the kernels, set the pace, and one graph replay replaces them."""
    device = torch.device(device)
    if device.type != "cuda":
        return skipped("CUDA graphs record and replay GPU kernel launches: they need a CUDA GPU")
    rows = mfu_ladder(config, micro_batch, device, repeats, 3, rungs=(RUNGS[3], GPU_RUNGS[0]))
    return {"without": rows[0], "with": rows[1], "speedup": rows[0]["step_s"] / rows[1]["step_s"]}


# ---- the torch reference (the GPU check) ----
def plain_loop(config, micro_batch: int, device="cuda", seconds: float = 20.0, warmup: int = 3, compile="blocks"):
    """The torch reference the course's trainer is judged against: the same GPT, a plain loop (no timeline, no
    hooks), ``torch.compile`` of each block (regional compilation, as the course's GPU size does: the compile
    stays within the GPU check's budget), fused AdamW, bf16 autocast, SDPA; trains for ``seconds`` after
    ``warmup`` steps (compile included there). Returns step time (median of the steps), tokens/s and MFU."""
    device = torch.device(device)
    step = make_step(config, micro_batch, device, dtype="bf16", compile=compile, fused=True)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(device)
    compile_s = time.perf_counter() - t0
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        s0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - s0)
    peak = peak_flops(device, "bf16")
    from ..debug import mfu

    flops = mfu.flops_per_token(config)["total"] * step.tokens
    med = statistics.median(times)
    return {
        "device": str(device),
        "micro_batch": micro_batch,
        "steps": len(times),
        "warmup_and_compile_s": compile_s,
        "step_s": med,
        "step_iqr_s": statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0]
        if len(times) > 3
        else 0,
        "tokens_per_s": step.tokens / med,
        "mfu": flops / med / peak["peak"],
        "peak_source": peak["source"],
        "compiled": compile if isinstance(compile, str) else bool(compile),
        "fused_adamw": True,
        "dtype": "bf16",
    }
