"""The projects' GPU size: models and data a GPU is for (``simlib train <project> --size gpu``).

At their CPU size the projects leave a GPU idle (issue 37: the GPT trained 600 steps in 9 s on an H200, bf16
changed nothing, the optimizer cost more than the forward pass). The GPU size of each:

=========  ============================================================  =====================================
project    model and data                                                held-out metric, baseline, budget
=========  ============================================================  =====================================
gpt        GPT-2's layout at 12 layers, hidden 1536, 12 heads of 128,     eval loss beside the unigram cross-
           context 1024 (343 M weights); bf16 where the GPU has it        entropy; 20 min of training
           (compute capability >= 8.0), else fp16 with loss scaling (T4,  (``seconds``), constant rate after
           V100); fused AdamW; per-block ``torch.compile`` (off:          warm-up (the step count depends on
           ``--task.compile false``); SDPA's flash attention.             the GPU)
           Data: a corpus prepared by ``simlib prepare gpt`` (TinyStories
           by default), else the shipped Shakespeare (memorised: a check
           of speed, not of learning)
vision     ResNet of 2 blocks per stage, width 64, on 64x64 upscaled,     accuracy beside logistic regression;
           augmented digits, batch 512; bf16 / fp16 as above              1,000 steps
finance    131,072 Monte-Carlo paths per step (256x the CPU size), a      eval loss beside the Black-Scholes
           64-wide 3-layer hedging network; fp32 (a 64-wide MLP is         delta's; 400 steps
           launch-bound: low precision buys nothing there)
=========  ============================================================  =====================================

``simlib train`` picks this size by itself when every rank has a GPU of its own and no size was asked for
(:func:`auto_size`), and says so. Each preset is a dict like the CPU sizes' (``task``, ``optim``, the budget)
plus ``plan``: the :class:`simlib.train.Plan` fields it needs (precision, gradient accumulation), and ``note``:
what the run's first lines should say (the GPT without a prepared corpus). Everything a
run's MFU needs is in its summary: the dtype (``plan.mixed_precision``) and the FLOPs per sample.

Vision and finance make their batches on the GPU (``augment_on`` / ``paths_on = "cuda"``): on one CPU thread a
batch of 512 warped 64x64 images took 660 ms and 131,072 paths 390 ms (measured here under load), against a few
tens of milliseconds of GPU work per step.
"""

from __future__ import annotations

import shutil
import subprocess

SIZES = ("quick", "full", "gpu")
GPU_SECONDS = 1200.0  # the GPT's training time at the GPU size: a Colab session survives it


def gpu_facts() -> list[dict]:
    """Every visible GPU: ``name``, ``memory_gib``, ``capability`` (major, minor). From ``nvidia-smi`` when it is
    there (no CUDA context in this process: the launcher's parent stays off the GPU), else from torch."""
    import os

    smi = shutil.which("nvidia-smi")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return []  # every GPU hidden
    if smi:
        cmd = [smi, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"]
        if visible:
            cmd += ["-i", visible]  # SLURM's mask: indices or UUIDs, as nvidia-smi takes them
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
            facts = []
            for line in out.strip().splitlines():
                name, mib, cap = (part.strip() for part in line.split(","))
                major, minor = (int(v) for v in cap.split("."))
                facts.append({"name": name, "memory_gib": float(mib) / 1024, "capability": (major, minor)})
            if facts:
                return facts
        except (OSError, ValueError, subprocess.SubprocessError):
            pass  # an old driver without compute_cap, or a mask nvidia-smi does not take: ask torch
    import torch

    if not torch.cuda.is_available():
        return []
    facts = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        facts.append({"name": p.name, "memory_gib": p.total_memory / 2**30, "capability": (p.major, p.minor)})
    return facts


def precision_for(facts: list[dict]) -> str:
    """``"bf16"`` when every GPU has bf16 tensor cores (Ampere and later: compute capability >= 8.0), else
    ``"fp16"`` (T4 7.5, V100 7.0), which the loop runs with dynamic loss scaling (``Plan.scales_loss``). No GPU
    (the GPU size asked for on a CPU, e.g. to try it small): ``"bf16"``, which CPU autocast runs."""
    return "bf16" if all(f["capability"] >= (8, 0) for f in facts) else "fp16"


def micro_batch_for(facts: list[dict]) -> int:
    """GPT windows of 1,024 tokens per forward pass on one GPU, by the smallest GPU's memory: 16 on 70 GiB and
    more (A100/H100-80GB, H200), 8 on 30 GiB and more (A100-40GB, V100-32GB, L40), else 4 (T4, L4, V100-16GB).
    At hidden 1536 and 16 windows the simulator puts a step at 38 GiB (weights, gradients and AdamW's states
    5.5 GB; activations by Korthikanti et al.'s s·b·h·34 bytes per layer)."""
    memory = min((f["memory_gib"] for f in facts), default=16.0)
    return 16 if memory >= 70 else 8 if memory >= 30 else 4


# The GPT's GPU shape, chosen for MFU on one H100/H200 in bf16 (issue 50): at hidden 768 with heads of 64 a
# step's GEMMs are skinny and its attention runs below the GEMMs' rate; the simulator (GEMMs priced by shape,
# simlib.sim.gemm_shape) put 768 x 12 heads at 25 % MFU, 1024 x 8 heads at 39 %, 1536 x 12 heads of 128 at 48 %
# on dgx_h200. The GPU check measures the figure (``benchmarks/gpu_check.py``, with a plain torch loop beside it).
GPT_SHAPE = dict(seq_len=1024, hidden=1536, num_layers=12, num_heads=12)


def auto_size(world_size: int, local_world_size: int, backend: str = "auto", gpus: int | None = None) -> tuple:
    """(size, reason) when the caller gave no size: ``"gpu"`` when every local rank has a GPU of its own and the
    backend allows it (as :func:`simlib.env.pick_backend` decides NCCL), else ``"full"``."""
    from .. import env

    gpus = env.gpu_count() if gpus is None else gpus
    if backend == "gloo":
        return "full", "--backend gloo runs the ranks on the CPU"
    if gpus == 0:
        return "full", "no GPU visible"
    if gpus < local_world_size:
        return "full", (
            f"{local_world_size} ranks on this node but {gpus} GPU(s): every rank needs a GPU of its "
            "own for the GPU size (ask for it with --size gpu only on enough GPUs)"
        )
    return "gpu", (
        f"every one of the {world_size} rank(s) has a GPU of its own ({gpus} visible); --size full runs the CPU size"
    )


def _accumulation(global_batch: int, world_size: int, micro: int) -> int:
    return max(1, global_batch // (world_size * micro))


def gpt(world_size: int = 1, facts: list[dict] | None = None, corpus: str | None = None) -> dict:
    """GPT-2 small's shape on the prepared corpus (``simlib prepare gpt``; none prepared: the shipped one)."""
    from ..train import OptimConfig
    from .gpt import prepare
    from .gpt.task import GPTTask

    facts = gpu_facts() if facts is None else facts
    micro = micro_batch_for(facts)
    global_batch = max(64, micro * world_size)  # 65,536 tokens a step on 1 to 2 GPUs
    corpus = prepare.default_corpus() if corpus is None else corpus
    task = GPTTask(**GPT_SHAPE, global_batch=global_batch, eval_windows=64, corpus=corpus, compile=True)
    optim = OptimConfig(lr=6e-4, warmup_steps=100, weight_decay=0.1, grad_clip=1.0, schedule="constant")
    # the target is a goal set from the baseline (60 % below the unigram loss), not a measured figure
    note = (
        ""
        if corpus
        else (
            "no prepared corpus, so it trains on the shipped 5 MB of Shakespeare, which GPT-2 "
            "small learns by heart within minutes (a check of speed, not of learning): run "
            "`simlib prepare gpt` once for TinyStories"
        )
    )
    return dict(
        task=task,
        seconds=GPU_SECONDS,
        eval_every=200,
        log_every=50,
        optim=optim,
        note=note,
        target=gpt_target(task),
        plan=dict(mixed_precision=precision_for(facts), accumulation=_accumulation(global_batch, world_size, micro)),
    )


def gpt_target(task) -> dict:
    """The GPT's goal on ``task``'s corpus: 60 % below its unigram cross-entropy (a goal set from the baseline,
    not a measured figure), so a corpus given with ``--task.corpus`` gets its own (``cli_train.resolve``)."""
    return {"eval_loss": round(0.4 * task.data.unigram_cross_entropy(), 2)}


def target_for(project: str, task) -> dict | None:
    """The GPU size's target of ``project`` recomputed for ``task`` (after ``--task.*`` overrides), or None when
    the project's target does not depend on the task."""
    return gpt_target(task) if project == "gpt" else None


def vision(world_size: int = 1, facts: list[dict] | None = None) -> dict:
    """A wider, deeper ResNet on 64x64 digits: ~3.6 GFLOP forward per image, 512 images a step."""
    from ..train import OptimConfig
    from .vision import DigitsTask

    facts = gpu_facts() if facts is None else facts
    task = DigitsTask(global_batch=512, image_size=64, width=64, blocks_per_stage=2, augment_on="cuda")
    steps = 1000
    optim = OptimConfig(name="sgd", lr=0.2, momentum=0.9, weight_decay=5e-4, warmup_steps=steps // 20)
    return dict(
        task=task,
        steps=steps,
        optim=optim,
        eval_every=100,
        log_every=25,
        target={"accuracy": 0.98},
        plan=dict(mixed_precision=precision_for(facts)),
    )


def finance(world_size: int = 1, facts: list[dict] | None = None) -> dict:
    """Many more Monte-Carlo paths (131,072 a step) through a wider, deeper hedging network; fp32."""
    from ..train import OptimConfig
    from .finance import HedgingTask

    steps = 400
    task = HedgingTask(global_batch=131072, block=4096, hidden=64, depth=3, paths_on="cuda")
    bs = task.evaluate_baseline()
    return dict(
        task=task,
        steps=steps,
        optim=OptimConfig(name="adamw", lr=3e-3, warmup_steps=steps // 20),
        eval_every=50,
        log_every=25,
        target={"eval_loss": bs["bs_rmse_sim"] ** 2},
        plan={},
    )


PRESETS = {"gpt": gpt, "vision": vision, "finance": finance}


def settings(project: str, world_size: int = 1, facts: list[dict] | None = None) -> dict:
    """The GPU size of ``project`` on ``world_size`` GPUs (``facts``: :func:`gpu_facts`, given in tests)."""
    if project not in PRESETS:
        raise ValueError(f"unknown project {project!r}: use one of {', '.join(PRESETS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return PRESETS[project](world_size, facts)
