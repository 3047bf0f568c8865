"""Honest MFU: the GPT's FLOPs from a stated formula (checked against torch's FLOP counter), over a stated peak.

MFU = model FLOPs per second / peak FLOP/s. Two ways it goes wrong (both reported by users as "133 % MFU"):
a FLOPs count that includes work the run does not do (or counts a matmul twice), and a peak below what the
hardware really does (a slow measurement, or an fp32 peak for a bf16 run). Here:

**FLOPs (per token, training = forward + backward).** Every weight matrix W (k x n) costs 2·k·n per token
forward and 4·k·n backward (the gradients of the input and of W): 6 per matrix weight. Attention's two
batched products (scores q·kᵀ, then mixing with v) cost 2·T·H each per token and layer forward, so 12·L·T·H
for training; with a causal mask only half of the scores are needed, so the *model* FLOPs count 6·L·T·H
(Kaplan et al. 2020 count it so; PaLM's MFU counts the full 12·L·T·H). Biases, LayerNorm, GELU and softmax are
not matmuls and are left out (they are a few per cent of the work here, and memory-bound).

    flops_per_token = 6 · (matmul weights) + 6 · L · T · H          (attention="causal", the default)

:func:`count` checks both terms against ``torch.utils.flop_counter.FlopCounterMode`` on one forward and
backward: the weight term equals the counter's ``mm``/``addmm`` total exactly; torch counts no FLOPs for the CPU
flash-attention kernel, so attention is run through its textbook form (two ``bmm``, full T x T) for the count,
which gives the full 12·L·T·H — twice the causal term. ``simlib.projects.gpt.model.GPTConfig.flops_per_token`` (what the run
record's MFU uses) counts 6 per *parameter*, biases and LayerNorm included: about 1 % above this formula at the
course's sizes, so the record's MFU errs high by that much, not more.

**Peak.** On a GPU, the datasheet's dense peak for the run's dtype (:data:`DATASHEET`, by the name torch reports;
:func:`device_peak`), counted once per GPU however many ranks share it, with a measured large-GEMM rate
(``4096³``) beside it; a GPU the table does not know is measured instead. On a CPU there is no honest datasheet
figure for "this process with its threads", so the peak is the measured matmul rate: the best of several fp32
(and, for a mixed-precision plan, low-precision) ``512³`` matmuls on each rank with its threads, summed over
ranks. (A ``512³`` matmul is the wrong yardstick on a GPU: launch-bound, 11 TFLOP/s on an H200 that does 785 on
large bf16 GEMMs, so MFU read 13.7 % for a run that used 0.1 %.) The run's ``summary["mfu_peak"]`` says which.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

DATASHEET = {
    # Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets (they print the 2:4-sparse figures: dense is
    # half); "fp32" is the non-tensor-core rate, "tf32" the tensor cores' (what torch uses for fp32 matmuls when
    # allowed). A key's words must all appear in the name torch reports (case-insensitive); the first key that
    # matches wins, so the more specific come first ("H200 NVL" before "H200", "GB200" before "B200").
    # Sources: NVIDIA H100 datasheet (SXM 1,979 / PCIe 1,513 / NVL 1,671 sparse bf16 TFLOP/s), NVIDIA H200
    # datasheet (SXM 1,979 / NVL 1,671), HGX B200 and HGX B300 datasheets (36 PFLOP/s sparse fp16/bf16 per 8 GPUs:
    # 2.25 dense each), GB200 NVL72 datasheet (5 PFLOP/s sparse per GPU).
    "H100 PCIe": {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "H100 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "H100 SXM": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H100": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},  # torch: "NVIDIA H100 80GB HBM3"
    "H200 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},  # 600 W PCIe card
    "H200": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},  # SXM: H100's compute, 4.8 TB/s
    "GB200": {"fp32": 80e12, "tf32": 1.25e15, "bf16": 2.5e15, "fp16": 2.5e15},
    "GB300": {"fp32": 80e12, "tf32": 1.25e15, "bf16": 2.5e15, "fp16": 2.5e15},
    "B200": {"fp32": 75e12, "tf32": 1.1e15, "bf16": 2.25e15, "fp16": 2.25e15},
    "B300": {"fp32": 75e12, "tf32": 1.1e15, "bf16": 2.25e15, "fp16": 2.25e15},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "A10G": {},  # AWS's variant of the A10: no NVIDIA datasheet figures; measured instead
    "A10": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
    "L40S": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12},
    "L4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "T4": {"fp32": 8.1e12, "fp16": 65e12},  # Turing: fp16 tensor cores, no bf16
    "V100 PCIe": {"fp32": 14e12, "fp16": 112e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12},  # SXM2; Volta: fp16 tensor cores, no bf16, no tf32
}
# The simulator's preset for each part (``simlib.sim.preset``), by the same first-match rule; a part without
# a preset of its own gets the nearest one, and ``preset_for`` says so.
PRESET_OF = {
    "H100 PCIe": ("h100-pcie", ""),
    "H100 NVL": ("h100-nvl", ""),
    "H100": ("h100", ""),
    "H200 NVL": (
        "h100-nvl",
        "no H200 NVL preset: the H100 NVL's (the same 835 TFLOP/s bf16; 94 GB at 3.9 TB/s "
        "where the H200 NVL has 141 GB at 4.8 TB/s)",
    ),
    "H200": ("h200", ""),
    "GB200": ("gb200", ""),
    "GB300": ("gb300", ""),
    "B200": ("b200", ""),
    "B300": ("b300", ""),
    "A100": ("a100", ""),
}
LARGE_GEMM = 4096  # the measured large-GEMM rate beside the datasheet's peak: (4096 x 4096) @ (4096 x 4096)


def matmul_weights(config) -> int:
    """Weights that enter a matmul: the (tied) embedding as the output head, and per block qkv, out, fc1, fc2."""
    h, f = config.hidden, config.ffn or 4 * config.hidden
    return config.vocab_size * h + config.num_layers * (3 * h * h + h * h + h * f + f * h)


def flops_per_token(config, attention: str = "causal") -> dict:
    """Training FLOPs per token of the course's GPT, by term: ``weights``, ``attention`` and ``total``.
    ``attention="causal"`` counts the half of the scores a causal mask needs; ``"full"`` all of them."""
    if attention not in ("causal", "full"):
        raise ValueError(f"attention must be 'causal' or 'full', got {attention!r}")
    weights = 6 * matmul_weights(config)
    attn = (6 if attention == "causal" else 12) * config.num_layers * config.seq_len * config.hidden
    return {"weights": weights, "attention": attn, "total": weights + attn}


def _textbook_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    import math

    import torch

    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    return torch.matmul(scores.softmax(-1), v)


@contextmanager
def textbook_attention():
    """Route ``F.scaled_dot_product_attention`` through two explicit matmuls (so FLOP counters see them)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _textbook_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def count(task, batch_index: int = 0) -> dict:
    """torch's FLOP counter on one training forward + backward of ``task``'s model over one global batch, per
    token: ``mm`` (weight matmuls: ``mm``/``addmm``), ``attention`` (the ``bmm`` of attention, full T x T),
    ``total``, and the formula's terms beside them."""
    from torch.utils.flop_counter import FlopCounterMode

    model = task.build_model()
    x, y = task.batch(batch_index)
    with textbook_attention(), FlopCounterMode(display=False) as counter:
        task.loss(model(x), y).backward()
    by_op = {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}
    tokens = y.numel()
    mm = (by_op.get("mm", 0) + by_op.get("addmm", 0)) / tokens
    attn = (by_op.get("bmm", 0) + by_op.get("baddbmm", 0)) / tokens
    return {
        "mm": mm,
        "attention": attn,
        "total": counter.get_total_flops() / tokens,
        "by_op": by_op,
        "formula": flops_per_token(task.config),
        "formula_full": flops_per_token(task.config, "full"),
    }


def measured_peak(device=None, dtypes=("float32",), size: int = 512, repeats: int = 5) -> float:
    """The best FLOP/s of ``repeats`` ``size³`` matmuls in each of ``dtypes`` on this process (its threads): an
    upper bound of what the run's matmuls can reach here (the best, not the median, so that a moment of load on
    a shared machine cannot lower the yardstick and push MFU over 1)."""
    import torch

    device = torch.device(device or "cpu")
    best = 0.0
    g = torch.Generator(device=device).manual_seed(0)  # its own generator: the run's random stream is untouched
    for name in dtypes:
        dtype = getattr(torch, name)
        a, b = (torch.randn(size, size, device=device, generator=g).to(dtype) for _ in range(2))
        (a @ b).sum().item()
        for _ in range(repeats):
            t0 = time.perf_counter()
            (a @ b).sum().item()
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


def _first_match(gpu_name: str, table: dict):
    """The first key of ``table`` whose words all appear in ``gpu_name`` (case-insensitive, not inside a longer
    name: "A10" is not in "A100", "L4" not in "L40S", "B200" not in "GB200"), or None."""
    import re

    name = gpu_name.upper()
    for key in table:
        if all(re.search(rf"(?<![0-9A-Z]){re.escape(part.upper())}(?![0-9])", name) for part in key.split()):
            return key
    return None


def datasheet_peak(gpu_name: str, dtype: str = "bf16") -> float | None:
    """The datasheet's dense peak of ``dtype`` for the first :data:`DATASHEET` key that matches ``gpu_name`` (see
    :func:`_first_match`), or None for a GPU or a dtype the table does not know."""
    key = _first_match(gpu_name, DATASHEET)
    return DATASHEET[key].get(dtype) if key else None


def preset_for(gpu_name: str) -> tuple[str, str]:
    """(name of the simulator's preset for this part, a note when it is only the nearest one); ("h200", note)
    for a part the table does not know (the preset measured on a real GPU)."""
    key = _first_match(gpu_name, PRESET_OF)
    if key is None:
        return "h200", f"no preset for {gpu_name!r}: the H200's (calibrated on a real H200) for want of one"
    return PRESET_OF[key]


def run_dtype(mixed_precision: str | None) -> str:
    """The dtype a run's matmuls use on a GPU: the plan's ``bf16``/``fp16``; for fp32, ``tf32`` when torch lets
    fp32 matmuls use the tensor cores (``torch.set_float32_matmul_precision("high")``, which
    ``torch.backends.cuda.matmul.allow_tf32 = True`` also sets), else ``fp32``."""
    import torch

    if mixed_precision:
        return mixed_precision
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def large_gemm_rate(device, dtype: str, size: int = LARGE_GEMM, repeats: int = 5) -> float:
    """The best FLOP/s of ``repeats`` ``size³`` matmuls in ``dtype`` on ``device`` (a GPU: host clock around a
    synchronised product). What the GPU reaches on a large GEMM, beside its datasheet peak."""
    import torch

    device = torch.device(device)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=g).to(torch_dtype) for _ in range(2))
    best = 0.0
    for i in range(repeats + 1):
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        if i:  # the first is warm-up (kernel selection)
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
    return best


def device_peak(device, mixed_precision: str | None, name: str | None = None, measure=large_gemm_rate) -> dict:
    """MFU's peak for one GPU: the datasheet's dense peak for the run's dtype (``source`` "datasheet"), with the
    measured large-GEMM rate beside it; a GPU the table does not know is measured instead (``source`` "measured").

    Returns ``peak`` (FLOP/s), ``source``, ``dtype``, ``name``, ``measured_large_gemm`` (FLOP/s) and ``text``
    (one line for the run's summary). ``name``: the GPU's name (default: torch's for ``device``)."""
    import torch

    device = torch.device(device)
    name = name or torch.cuda.get_device_name(device)
    dtype = run_dtype(mixed_precision)
    sheet = datasheet_peak(name, dtype)
    measured = measure(device, dtype)
    gemm = f"{LARGE_GEMM}^3 {dtype} GEMM measured at {measured / 1e12:.0f} TFLOP/s"
    if sheet:
        return {
            "peak": sheet,
            "source": "datasheet",
            "dtype": dtype,
            "name": name,
            "measured_large_gemm": measured,
            "text": f"datasheet: {name} dense {dtype} {sheet / 1e12:.1f} TFLOP/s (simlib.debug.mfu.DATASHEET); "
            f"{gemm} ({measured / sheet:.0%} of it)",
        }
    return {
        "peak": measured,
        "source": "measured",
        "dtype": dtype,
        "name": name,
        "measured_large_gemm": measured,
        "text": f"measured: no datasheet entry for {name!r} in {dtype}, so the peak is the {gemm}",
    }
