"""The cluster-scale validation set: published runs with context parallelism, experts, Blackwell, FP8 and TP overlap.

Rows live in ``simlib/sim/data/scale_runs.csv`` (one per run, its source URL and table on the row), transcribed
from two independent sources:

- **Megatron-Bridge** (NVIDIA NeMo), ``docs/performance-summary-archive.md``: the 25.11 and 26.02 containers'
  pre-training tables — Llama 3 8B/70B/405B, Qwen3 30B-A3B / 235B-A22B, DeepSeek-V3 and GPT-OSS 120B on DGX H100,
  B200, B300, GB200 and GB300, BF16, FP8 (current scaling) and MXFP8, with TP, PP, CP, VP, EP, FSDP, micro- and
  global batch stated; tokens/s per GPU measured. What the tables do not say is taken as the performance recipes'
  defaults (sequence parallelism and TP communication overlap when tp > 1, the distributed optimizer, fused
  attention, no recomputation, CP over p2p = ring, experts force-balanced and dropless) — said on every row —
  except where the release's performance config says otherwise (the row's settings columns).
- **Llama 3** (Dubey et al. 2024, Table 4): 405B on 8K/16K H100s, CP 16 at 128K; interleaving not stated.
- **NeMo** long-sequence and 24.07 performance pages (Llama 2/3 FP8, CP, H100/B200); **Megatron-MoE-ModelZoo**
  (Megatron-LM, Qwen3-235B-A22B on H100/GB200/GB300, its TFLOP/s counted by Megatron-LM's causal formula) and
  **NeMo AutoModel** (FSDP2, MoE on H100): ``simlib/sim/data/README.md`` says where each row is from.

What a row states beyond its layout is in its columns, read the same way for every source (:data:`FLAGS`,
``recompute``, ``recompute_modules``, ``offload_layers``, ``flops_formula``, ``stack``, :data:`FEATURES`); an empty
cell is "not stated" and takes the default written beside those names.

Every row has ``kinds`` (long_context: cp > 1; moe; blackwell; fp8; async_tp: TP communication overlap) so that
errors can be reported per kind. The fit/test split was written into the CSV by the transcription, before any
prediction was computed: within each source and version, rows in file order alternate fit, test. Nothing is
fitted on the test half. ``error = predicted / measured − 1`` (positive: predicted faster).
"""

from __future__ import annotations

import csv
from pathlib import Path

from .cost import predict
from .hardware_presets import dgx_h100, preset
from .model_zoo import LLAMA_SIZES, llama_size
from .runs import measured_mfu
from .strategy import Strategy

DATA = Path(__file__).parent / "data" / "scale_runs.csv"
KINDS = ("long_context", "moe", "blackwell", "fp8", "async_tp")


# What a row states beyond its layout, as columns (an empty cell: not stated, and the reader takes the default
# written here, the same for every source). The Megatron flags default to off in Megatron-LM's own arguments
# (megatron/training/arguments.py: --tp-comm-overlap, --overlap-param-gather, --overlap-moe-expert-parallel-comm,
# --fp8-param-gather are store_true), so a source that does not state them is priced without them: that is the
# reader's reading of "not stated", not a fact of the run. Megatron-Bridge's rows carry its performance recipes'
# settings (TP overlap when tp > 1, the distributed optimizer's overlapped parameter all-gather) and, where a release's
# performance config differs, that config's (simlib/sim/data/README.md says which: EP all-to-all overlap, no TP
# overlap for Qwen3-235B on H100, recomputed modules of DeepSeek-V3 and GPT-OSS, Llama 3 70B's offloaded layers).
FLAGS = ("tp_overlap", "param_gather_overlap", "ep_overlap", "fp8_param_gather")  # 1, 0 or empty (= 0)
RECOMPUTE = {"": "none", "none": "none", "full": "full", "selective": "selective"}  # Megatron's --recompute-granularity
# ``stack``: the framework whose gradient buckets the row's DP communication uses — "megatron-core" (Megatron-LM,
# Megatron-Bridge, NeMo: :func:`megatron_bucket_bytes`), anything else PyTorch DDP's 25 MB
# ``flops_formula``: how the source turned its step into TFLOP/s (rows measured in TFLOP/s are compared in the
# source's own unit): "" — :meth:`ModelSpec.flops_per_token` (full s² attention; NeMo's ``flops_formulas.py`` for
# Llama, whose tokens/s and TFLOP/s agree with it), "megatron-lm" — :func:`megatron_lm_flops_per_token`.
FLOPS_FORMULAS = ("", "megatron-lm")
# ``dispatcher``: how tokens reach experts on other nodes (Strategy.ep_dispatcher) — "deepep" for DeepEP and HybridEP
# (Megatron's flex dispatcher: a token crosses once to each node holding its experts), "alltoall" or empty (not
# stated: Megatron-Bridge's MoE recipes' alltoall dispatcher, each of a token's top-k copies on its own)
DISPATCHERS = {"": "alltoall", "alltoall": "alltoall", "deepep": "deepep"}
# ``features``: what else a row states (space-separated). None: the simulator prices it as it prices every run (said
# why); a string: the row cannot be stated, and why.
FEATURES = {
    "cuda_graphs": None,  # CUDA graphs of attention, router and token preprocessing (Megatron's --cuda-graph-scope
    # attn moe_router moe_preprocess): the simulator charges no per-launch host time there (its only host term is
    # the experts' per-expert launches, cluster_ops.MOE_HOST_PER_LOCAL_EXPERT, outside those scopes): no change
    "dropless": "a dropless router's imbalance over the experts is not stated (Strategy.expert_imbalance)",
    "offload_modules": "activation offloading of single modules (expert_fc1, moe_act) is not in simlib.sim.offload "
    "(whole layers only)",
    "automodel_layout": "NeMo AutoModel's layout of DeepSeek-V3's 61 layers over pp 4 x vp 8 is not stated",
    "recompute_not_stated": "whether activations are recomputed is not stated",
    "ep_not_stated": "the expert-parallel degree is not stated ('-' in the table)",
    "torch_compile": "torch.compile's kernel fusion is not in the cost model",
}


def recipe_settings(row: dict) -> dict:
    """TP communication overlap, EP all-to-all overlap, recomputed modules (and offloaded layers, where any) of a
    row, from its columns."""
    out = dict(
        tp_overlap=row["tp_overlap"] and row["tp"] > 1,
        ep_overlap=row["ep_overlap"],
        recompute_modules=row["recompute_modules"],
    )
    if row["offload_layers"]:
        out["offload_layers"] = row["offload_layers"]
    return out


def megatron_lm_flops_per_token(model) -> float:
    """Model FLOPs per token (forward and backward) as Megatron-LM counts them when it reports TFLOP/s
    (``num_floating_point_operations``, megatron/training/training.py): 12·L·h² per layer for the attention
    projections scaled by (1 + groups/heads)·(heads·d/h), the core attention at *half* the s² term ("only half of the
    attention matrix is non-zero": causal), the dense, routed (top-k of ``moe_ffn_hidden_size``) and shared MLPs ×
    3/2 if gated, and the logits 6·h·V over the vocabulary padded to a multiple of 128 (its
    ``--make-vocab-size-divisible-by``; × tp is left out: under 0.1 %); no router, no norms. Grouped-query attention
    only (latent attention and windows have their own branches there, not read here)."""
    if model.kv_lora or model.window:
        raise ValueError(f"{model.name}: megatron_lm_flops_per_token reads grouped-query attention only")
    L, h, s, H = model.layers, model.hidden, model.seq_len, model.heads
    d = model.head_size or h // H
    groups = model.kv_heads or H
    g = 1.5 if model.gated_mlp else 1.0
    attention = 12 * L * h * h * (1 + groups / H + s / h / 2) * (H * d / h)
    moe_layers = L - model.dense_layers if model.experts else 0
    mlp = (
        12
        * h
        * g
        * (
            (L - moe_layers) * model.ffn
            + moe_layers * (model.expert_width * model.top_k + model.shared_experts * model.expert_width)
        )
    )
    vocab = -(-model.vocab // 128) * 128
    return attention + mlp + 6 * h * vocab


def flops_per_token(row: dict, model) -> float:
    """FLOPs per token by the row's source's formula (``flops_formula``)."""
    return megatron_lm_flops_per_token(model) if row["flops_formula"] == "megatron-lm" else model.flops_per_token()


def measured_tokens(row: dict, model) -> float:
    """The row's measured tokens per second per GPU (a TFLOP/s figure turned back with its source's formula)."""
    if row["metric"] == "tokens_per_s_per_gpu":
        return row["measured"]
    return row["measured"] * 1e12 / flops_per_token(row, model)


def deepseek_v3_layout(pp: int, vp: int) -> tuple | None:
    """Layers per pipeline rank of DeepSeek-V3 in Megatron-Bridge's recipes (``recipes/deepseek/deepseek_v3.py``,
    ``set_deepseek_v3_pipeline_model_parallel_layout``): its model chunks, 4 of [16, 16, 16, 13], 8 of
    [8, ..., 8, 5] or 16 of [4, ..., 4, 1], the embedding on the first chunk, the MTP module and the loss on the
    last (which takes 3 decoder layers' place). The recipe lists (pp, vp) = (4, 1), (8, 1), (4, 2), (16, 1),
    (8, 2), (4, 4) (the same at tags v0.2.2 and v0.3.0); 26.02's GB300 FP8 config runs pp 2 × vp 8 with the
    16-chunk list (``pp_layout="Et*4|(t*4|)*14tmL"``); 25.11's pp 2 × vp 4 rows are taken as the 8-chunk list, an
    assumption. 32 chunks (pp 8 × vp 4): the one such layout of the same release, v0.2.2's H100 performance config
    (``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py``, ``layout="Et|(tt|)*30mL"``: the embedding
    and 1 layer, 30 chunks of 2, then MTP and the loss alone), taken for 25.11's GB200 pp 8 × vp 4 row, whose own
    config (pp 4 × vp 4) writes none for that shape — an assumption. None where no chunk list has pp × vp chunks."""
    chunks = {4: [16, 16, 16, 13], 8: [8] * 7 + [5], 16: [4] * 15 + [1], 32: [1] + [2] * 30 + [0]}.get(pp * vp)
    if chunks is None:
        return None
    return tuple(sum(chunks[r::pp]) for r in range(pp))  # rank r holds chunks r, r + pp, ... (interleaving)


INTS = (
    "gpus",
    "global_batch",
    "micro_batch",
    "seq_len",
    "fsdp",
    "tp",
    "pp",
    "cp",
    "vp",
    "ep",
    "first_stage_layers",
    "last_stage_layers",
)


def load_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in INTS:
            r[k] = int(r[k])
        r["measured"] = float(r["measured"])
        for k in FLAGS:
            if r[k] not in ("", "0", "1"):
                raise ValueError(f"{path.name} {r['id']}: {k} must be 1, 0 or empty (not stated), got {r[k]!r}")
            r[k] = r[k] == "1"
        if r["recompute"] not in RECOMPUTE or r["flops_formula"] not in FLOPS_FORMULAS:
            raise ValueError(
                f"{path.name} {r['id']}: recompute {r['recompute']!r} (one of {list(RECOMPUTE)}) or flops_formula "
                f"{r['flops_formula']!r} (one of {list(FLOPS_FORMULAS)}) not read"
            )
        r["recompute"] = RECOMPUTE[r["recompute"]]
        if r["dispatcher"] not in DISPATCHERS:
            raise ValueError(
                f"{path.name} {r['id']}: dispatcher must be one of {list(DISPATCHERS)}, got {r['dispatcher']!r}"
            )
        r["dispatcher"] = DISPATCHERS[r["dispatcher"]]
        r["recompute_modules"] = tuple(r["recompute_modules"].split())
        r["offload_layers"] = int(r["offload_layers"] or 0)
        r["features"] = tuple(r["features"].split())
        unknown = [f for f in r["features"] if f not in FEATURES]
        if unknown:
            raise ValueError(f"{path.name} {r['id']}: features {unknown} not read (known: {list(FEATURES)})")
    return rows


def kinds_of(row: dict) -> list[str]:
    out = []
    if row["cp"] > 1:
        out.append("long_context")
    if row["ep"] > 1 or (row["model"] in LLAMA_SIZES and LLAMA_SIZES[row["model"]].get("experts")):
        out.append("moe")
    if row["gpu"] in ("b200", "gb200", "b300", "gb300"):
        out.append("blackwell")
    if row["precision"] == "fp8":
        out.append("fp8")
    if recipe_settings(row)["tp_overlap"]:
        out.append("async_tp")
    return out


def why_inexpressible(row: dict) -> str:
    reasons = []
    if row["model"] not in LLAMA_SIZES:
        reasons.append(f"the model {row['model']!r} has no shape in simlib.sim.model_zoo.LLAMA_SIZES")
    reasons += [FEATURES[f] for f in row["features"] if FEATURES[f]]
    if row["vp"] == 0:
        reasons.append("the interleaving depth (virtual pipeline stages) is not stated by the source")
    if row["model"] == "deepseek-v3" and row["pp"] > 1 and deepseek_v3_layout(row["pp"], row["vp"]) is None:
        reasons.append(
            f"DeepSeek-V3's pipeline layout for pp = {row['pp']}, vp = {row['vp']} is not in the "
            "recipe (61 layers do not split evenly)"
        )
    return "; ".join(reasons)


def hardware_of(row: dict):
    hw = dgx_h100() if row["gpu"] == "h100" else preset(row["gpu"])
    if row["source"] == "llama3-paper":  # Meta's RoCE cluster: pods of 3,072 GPUs (384 nodes) with full bisection,
        # 1:7 between pods (Dubey et al. 2024 §3.3.1); only uniform (all-to-all) traffic feels the taper
        hw = hw.with_fabric(nodes_per_pod=384, oversubscription=7.0)
    return hw


def megatron_bucket_bytes(dp: int, grad_bytes: int = 2) -> float:
    """Megatron-Core's gradient bucket when none is set: max(40M, 1M × dp) parameters ("if using very large
    dp_sizes, make buckets larger to ensure that chunks used in NCCL ring-reduce implementations are large enough
    to remain bandwidth-bound rather than latency-bound": megatron/core/distributed/distributed_data_parallel.py),
    of bf16 gradients (Megatron-Bridge's performance recipes reduce in bf16: grad_reduce_in_fp32=False)."""
    return max(40e6, 1e6 * dp) * grad_bytes


def strategy_of(row: dict, model) -> Strategy:
    """The row's layout as a Strategy (the recipe defaults of the module docstring where the table is silent)."""
    tp, pp, cp, vp = row["tp"], row["pp"], row["cp"], max(row["vp"], 1)
    dp = row["gpus"] // (tp * pp * cp)
    m = row["global_batch"] // (dp * row["micro_batch"])
    first, last = row["first_stage_layers"], row["last_stage_layers"]
    if pp > 1 and vp == 1 and model.layers % pp and not first:
        # Megatron's account_for_embedding/loss_in_pipeline_split: the end stages take one layer fewer
        first = last = (model.layers + 2) // pp - 1
    layout = deepseek_v3_layout(pp, vp) if row["model"] == "deepseek-v3" and pp > 1 else None
    if layout:
        first = last = 0
    fsdp = bool(row["fsdp"])
    return Strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=row["ep"],
        micro_batch=row["micro_batch"],
        num_micro_batches=m,
        zero_stage=3 if fsdp else 1,
        fsdp=fsdp,
        overlap=True,
        # the distributed optimizer's reduce-scatter under backward, all-gather under the next forward (Megatron's
        # --overlap-grad-reduce --overlap-param-gather; Megatron-Bridge's docs, training/communication-overlap:
        # "exposes only one DP communication chunk"): the row's column
        param_gather_overlap=row["param_gather_overlap"] and not fsdp,
        fp8_param_gather=row["fp8_param_gather"] and row["precision"] in ("fp8", "fp4"),
        bucket_bytes=megatron_bucket_bytes(dp) if row["stack"] == "megatron-core" else 25e6,
        recompute=row["recompute"],
        # Transformer Engine's fused attention where the stack is Megatron-Core (cuDNN's on Hopper+), else flash-attn 2
        attention="cudnn" if row["stack"] == "megatron-core" else "flash",
        schedule="interleaved" if vp > 1 else "1f1b",
        virtual_stages=vp,
        sequence_parallel=tp > 1,
        **recipe_settings(row),
        dtype=row["precision"],
        fp8_recipe=row["fp8_recipe"] or "delayed",
        cp_kind="allgather" if row["source"] == "llama3-paper" else "ring",
        ep_dispatcher=row["dispatcher"],
        first_stage_layers=first if vp == 1 else 0,
        last_stage_layers=last if vp == 1 else 0,
        stage_layout=layout or (),
        pipeline_outer=True,
    )  # Megatron's rank order (tp-cp-ep-dp-pp), both sources


def predict_row(row: dict, hardware=None) -> dict:
    out = {
        k: row[k]
        for k in (
            "id",
            "split",
            "source",
            "version",
            "model",
            "gpu",
            "gpus",
            "precision",
            "tp",
            "pp",
            "cp",
            "vp",
            "ep",
            "measured",
            "metric",
        )
    }
    out["kinds"] = ",".join(kinds_of(row))
    reason = why_inexpressible(row)
    out.update(expressible=not reason, reason=reason, predicted=None, error=None, fits=None, memory_gb=None)
    if reason:
        return out
    model = llama_size(row["model"], seq_len=row["seq_len"])
    hw, s = hardware or hardware_of(row), strategy_of(row, model)
    p = predict(model, hw, s)
    tokens = (
        p.throughput * model.seq_len / row["gpus"]
        if p.fits
        else s.global_batch * model.seq_len / p.step_time / row["gpus"]
    )
    predicted = tokens if row["metric"] == "tokens_per_s_per_gpu" else tokens * flops_per_token(row, model) / 1e12
    out.update(
        predicted=predicted,
        error=predicted / row["measured"] - 1,
        fits=p.fits,
        memory_gb=p.memory["total"] / 1e9,
        # the MFU as the source counts it (its own FLOPs formula: Megatron-LM's causal count at 128K is less than
        # half of the full-s² one), what the plausibility guard's "best published" reads
        mfu_measured=measured_mfu(model, hw, s, p, predicted / row["measured"] - 1)
        * flops_per_token(row, model)
        / model.flops_per_token(),
        exposed_comm_share=p.exposed_comm / p.step_time,
        bubble_share=p.bubble / p.step_time,
    )
    return out


def validation_table(path: Path = DATA):
    import pandas as pd

    return pd.DataFrame([predict_row(r) for r in load_rows(path)])


def summary(table, by: str = "source"):
    """Mean |error|, mean signed error and rows per group (``by``: a column, or "kind": each row counted under
    each of its kinds), both halves, expressible rows only."""
    import pandas as pd

    ok = table[table.expressible].copy()
    ok["error"] = ok["error"].astype(float)
    if by == "kind":
        ok = ok.assign(kind=ok["kinds"].str.split(",")).explode("kind")
        ok = ok[ok["kind"].astype(bool)]
    out = []
    for (group, split), g in ok.groupby([by, "split"]):
        out.append(
            dict(
                group=group,
                split=split,
                rows=len(g),
                mean_abs_error=g.error.abs().mean(),
                mean_error=g.error.mean(),
                max_abs_error=g.error.abs().max(),
                not_fitting=int((~g.fits.astype(bool)).sum()),
            )
        )
    return pd.DataFrame(out)


def fit_moe_host_per_expert(path: Path = DATA) -> float:
    """The one fitted term of the MoE layer (:data:`simlib.sim.cluster_ops.MOE_HOST_PER_LOCAL_EXPERT`), from the
    *fit* half only: the median over its MoE rows of (measured − predicted step without the term) divided by the
    MoE layer passes of the slowest pipeline rank (micro-batches × its MoE layers, bubble included) × the experts
    on a rank. Test rows are never read."""
    import statistics

    ratios = [r for split, _, r in moe_host_ratios(path, with_split=True) if split == "fit"]
    return max(0.0, statistics.median(ratios))  # a host time is not negative


def moe_host_ratios(path: Path = DATA, with_split: bool = False) -> list[tuple]:
    """(id or split, source, ratio) per stated MoE row, both halves: (measured − predicted step without the MoE
    host term) / (MoE layer passes × local experts), what :func:`fit_moe_host_per_expert` takes the median of
    (``simlib.sim.by_source`` refits it on other sources)."""
    from . import cluster_ops

    saved, cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = cluster_ops.MOE_HOST_PER_LOCAL_EXPERT, 0.0
    try:
        ratios = []
        for row in load_rows(path):
            if why_inexpressible(row):
                continue
            model = llama_size(row["model"], seq_len=row["seq_len"])
            if not model.experts:
                continue
            s = strategy_of(row, model)
            p = predict(model, hardware_of(row), s)
            measured = s.global_batch * model.seq_len / row["gpus"] / measured_tokens(row, model)
            stages = (
                s.stage_layers(model.layers)
                if s.virtual_stages == 1 or s.stage_layout
                else [model.layers / s.pp] * s.pp
            )
            moe_here = max(stages) - (model.dense_layers if s.pp == 1 else 0)
            passes = s.num_micro_batches * moe_here + (s.pp - 1) * moe_here / s.virtual_stages
            ratio = (measured - p.step_time) / passes / max(model.experts // s.ep, 1)
            ratios.append((row["split"] if with_split else row["id"], row["source"], ratio))
    finally:
        cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = saved
    return ratios
