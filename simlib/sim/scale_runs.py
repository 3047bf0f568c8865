"""The cluster-scale validation set: published runs with context parallelism, experts, Blackwell, FP8 and TP overlap.

Rows live in ``simlib/sim/data/scale_runs.csv`` (one per run, its source URL and table on the row), transcribed
from two independent sources:

- **Megatron-Bridge** (NVIDIA NeMo), ``docs/performance-summary-archive.md``: the 25.11 and 26.02 containers'
  pre-training tables — Llama 3 8B/70B/405B, Qwen3 30B-A3B / 235B-A22B, DeepSeek-V3 and GPT-OSS 120B on DGX H100,
  B200, B300, GB200 and GB300, BF16, FP8 (current scaling) and MXFP8, with TP, PP, CP, VP, EP, FSDP, micro- and
  global batch stated; tokens/s per GPU measured. What the tables do not say is taken as the performance recipes'
  defaults (sequence parallelism and TP communication overlap when tp > 1, the distributed optimizer, fused
  attention, no recomputation, CP over p2p = ring, experts force-balanced and dropless) — said on every row —
  except where the release's performance config says otherwise (:data:`RECIPE_SETTINGS`).
- **Llama 3** (Dubey et al. 2024, Table 4): 405B on 8K/16K H100s, CP 16 at 128K; interleaving not stated.

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
from .model_zoo import llama_size
from .runs import measured_mfu
from .strategy import Strategy

DATA = Path(__file__).parent / "data" / "scale_runs.csv"
KINDS = ("long_context", "moe", "blackwell", "fp8", "async_tp")
INEXPRESSIBLE_MODELS: dict = {}  # every model of the set has its shape (DeepSeek-V3: latent attention and MTP;
# GPT-OSS: windows and sinks; simlib.sim.attention)


# Settings the tables do not show that differ from the recipe defaults above, read in Megatron-Bridge's
# performance configs of the same release (tag v0.2.2, whose docs first hold the 25.11 table, the settings used
# here unchanged since v0.2.0; v0.3.0, whose docs hold the 26.02 table;
# scripts/performance/configs/{qwen3 or qwen, deepseek, gpt_oss}/*workload_base_configs.py and *_llm_pretrain.py):
# ``moe_a2a_overlap=True`` (helpers.set_moe_a2a_overlap_overrides: overlap_moe_expert_parallel_comm), for
# Qwen3-235B on H100 ``CommOverlapConfig(tp_comm_overlap=False)``, and ``recompute_modules`` (DeepSeek-V3,
# GPT-OSS). Llama keeps the defaults. Keyed by (version, model, gpu): a table's row may differ from its config in a
# degree (25.11's Qwen3-235B on B200 ran vp 2 where the config says 4); the setting is taken for the row all the same.
_OSS = dict(recompute_modules=("layernorm", "moe_act"))
_MLA_UP = dict(recompute_modules=("mla_up_proj",))
RECIPE_SETTINGS = {
    ("25.11", "qwen3-235b-a22b", "b200"): dict(ep_overlap=True),
    ("25.11", "qwen3-235b-a22b", "h100"): dict(ep_overlap=True, tp_overlap=False),
    ("25.11", "qwen3-30b-a3b", "h100"): dict(ep_overlap=True),
    ("26.02", "qwen3-235b-a22b", "b300"): dict(ep_overlap=True),
    ("26.02", "qwen3-235b-a22b", "h100"): dict(ep_overlap=True, tp_overlap=False),
    ("26.02", "qwen3-30b-a3b", "h100"): dict(ep_overlap=True),
    ("25.11", "deepseek-v3", "gb300"): dict(recompute_modules=("moe_act",)),
    ("25.11", "deepseek-v3", "gb200"): _MLA_UP,
    ("25.11", "deepseek-v3", "b200"): _MLA_UP,
    ("26.02", "deepseek-v3", "gb300"): _MLA_UP,  # the FP8 config (the BF16 one has moe_act): the row is MXFP8
    ("26.02", "deepseek-v3", "b200"): _MLA_UP,
    **{(v, "gpt-oss-120b", g): _OSS for v in ("25.11", "26.02") for g in ("gb200", "b200", "h100")},
}

# Activation offloading (simlib.sim.offload) of Llama 3 70B's Megatron-FSDP configs, layers by (gpu, precision),
# the same at v0.2.2 (configs/llama3/workload_base_configs.py) and v0.3.0 (configs/llama/
# llama3_workload_base_configs.py, V1 and V2): ``cpu_offloading_num_layers``; the FSDP rows only (the MXFP8 ones
# run pp 4 × vp 5 without it)
OFFLOAD_LAYERS = {
    ("gb300", "bf16"): 30,
    ("gb300", "fp8"): 20,
    ("gb200", "bf16"): 20,
    ("gb200", "fp8"): 40,
    ("b200", "fp8"): 5,
}


def recipe_settings(row: dict) -> dict:
    """TP communication overlap, EP all-to-all overlap, recomputed modules and offloaded layers of a row: the
    recipe defaults, or RECIPE_SETTINGS and OFFLOAD_LAYERS."""
    mb = row["source"] == "megatron-bridge"
    out = dict(tp_overlap=row["tp"] > 1 and mb, ep_overlap=False, recompute_modules=())
    out.update(RECIPE_SETTINGS.get((row["version"], row["model"], row["gpu"]), {}) if mb else {})
    out["tp_overlap"] = out["tp_overlap"] and row["tp"] > 1
    if mb and row["model"] == "llama3-70b" and row["fsdp"]:
        out["offload_layers"] = OFFLOAD_LAYERS.get((row["gpu"], row["precision"]), 0)
    return out


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
    return rows


def kinds_of(row: dict) -> list[str]:
    out = []
    if row["cp"] > 1:
        out.append("long_context")
    if row["ep"] > 1 or row["model"] in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"):
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
    if row["model"] in INEXPRESSIBLE_MODELS:
        reasons.append(INEXPRESSIBLE_MODELS[row["model"]])
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
        # the distributed optimizer's reduce-scatter under backward, all-gather under the next forward: Megatron-
        # Bridge's performance recipes set ddp.overlap_grad_reduce and ddp.overlap_param_gather (its docs,
        # training/communication-overlap: "exposes only one DP communication chunk"); Llama 3's paper does not say
        param_gather_overlap=not fsdp and row["source"] == "megatron-bridge",
        bucket_bytes=megatron_bucket_bytes(dp) if row["source"] == "megatron-bridge" else 25e6,
        attention="flash",
        schedule="interleaved" if vp > 1 else "1f1b",
        virtual_stages=vp,
        sequence_parallel=tp > 1,
        **recipe_settings(row),
        dtype=row["precision"],
        fp8_recipe=row["fp8_recipe"] or "delayed",
        cp_kind="allgather" if row["source"] == "llama3-paper" else "ring",
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
        else strategy_of(row, model).global_batch * model.seq_len / p.step_time / row["gpus"]
    )
    predicted = tokens if row["metric"] == "tokens_per_s_per_gpu" else tokens * model.flops_per_token() / 1e12
    out.update(
        predicted=predicted,
        error=predicted / row["measured"] - 1,
        fits=p.fits,
        memory_gb=p.memory["total"] / 1e9,
        mfu_measured=measured_mfu(model, hw, s, p, predicted / row["measured"] - 1),
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

    return statistics.median(r for split, _, r in moe_host_ratios(path, with_split=True) if split == "fit")


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
            measured = s.global_batch * model.seq_len / row["gpus"] / row["measured"]
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
