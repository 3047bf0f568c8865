"""The broad validation: published, measured training runs from several independent sources, predicted.

The rows live in ``simlib/sim/data/published_runs.csv`` (one per run, every input stated, its source URL and
table on the row), beside the two Megatron-LM sets already in :mod:`simlib.sim.published`:

- **llm-foundry** (MosaicML): MPT models 125M–70B trained with PyTorch FSDP (FULL_SHARD / SHARD_GRAD_OP) and
  FlashAttention on 8–512 A100 40 GB, A100 80 GB and H100 80 GB, sequence 512–65,536, bf16 and FP8
  (``scripts/train/benchmarking/README.md``; shapes from ``scripts/train/yamls/pretrain/mpt-*.yaml``).
- **torchtitan** (PyTorch): Llama 2 / Llama 3 with FSDP2 on 64 A100 80 GB (``docs/performance.md``), and
  Llama 3.1 on H100s (``benchmarks/llama3_h100_202412_torchtitan.md``).
- **Narayanan et al. 2021** Table 1 and **Korthikanti et al. 2022** Table 5 (Megatron-LM, A100).

The fit/test split was fixed before any error was computed: within each source, rows in file order, even
positions "fit", odd "test". Nothing is fitted on either half; "fit" is the half looked at while the model was
being changed, "test" the half held out. A row the simulator cannot state (hardware without a preset, context
parallelism, …) stays in the table with ``expressible=False`` and the reason.

Errors are in throughput: ``error = predicted / measured − 1`` (positive: predicted faster); for rows published
as iteration times that is measured time / predicted time − 1.
"""

from __future__ import annotations

import csv
from pathlib import Path

from .cost import predict
from .hardware_presets import dgx_a100, dgx_h100, dgx_h200
from .model_zoo import transformer
from .published import KORTHIKANTI_2022, NARAYANAN_2021_TABLE_1
from .strategy import Strategy

DATA = Path(__file__).parent / "data" / "published_runs.csv"
KORTHIKANTI_SOURCE = (
    "Korthikanti et al. 2022 (arXiv 2205.05198) Table 5 as quoted by calculon-ai/calculon "
    "calculon/megatron/validation.py"
)

HARDWARE = {
    "a100_80gb": lambda: dgx_a100(80),
    "a100_40gb": lambda: dgx_a100(40),
    "h100_80gb": dgx_h100,
    "h200": dgx_h200,
}
# a part named with its fabric ("a100_80gb_400gbps": fms-fsdp's "with 400Gbps") is not read: the source does not say
# whether that is per GPU or per node, which Hardware.with_fabric must be told (nic_gbps, nics_per_node)
# which software generation a source's H100 rows ran on: llm-foundry's H100 tables were made Oct 2023 - Jan 2024
# (the README's history) with PyTorch 2.x on cuBLAS 12.0/12.1
H100_SOFTWARE = {"llm-foundry": "2023"}
PRECISION = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8", "fp8": "fp8"}
SHARDING = {"FULL_SHARD": 3, "FULL_SHARD (FSDP2)": 3, "SHARD_GRAD_OP": 2}
# torchtitan's names: "selective op" is its per-op policy, "selective layer" (ac_freq 2) every other layer
RECOMPUTE = {"none": "none", "full": "full", "selective": "op", "selective_layer": "every_other"}
# Composer's FSDP mixed precision: DEFAULT reduces gradients in fp32, PURE in the compute dtype
# llm-foundry's attn_impl: "triton" (its submit script's default when the tables were made) is the Triton
# FlashAttention kernel of the FlashAttention-1 generation; "flash" is flash-attn 2 (FlashAttention-2)
ATTENTION = {"triton": "flash1", "flash": "flash", "flash1": "flash1", "unfused": "unfused"}
# torchtitan's Llama without torch.compile runs its norms, rotary embeddings and SwiGLU op by op (its configs of
# the time: norm_type = "rmsnorm", compile = false); llm-foundry's MPT uses fused LayerNorm and GeLU kernels
KERNELS = {"torchtitan": "eager"}
REDUCE = {"DEFAULT": "fp32", "PURE": "", "param bf16, reduce fp32": "fp32"}


def load_rows(path: Path = DATA) -> list[dict]:
    """The CSV's rows as dicts (numbers as numbers)."""
    ints = (
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "ffn_hidden",
        "gated_mlp",
        "vocab",
        "tied_embeddings",
        "bias",
        "dropout",
        "seq_len",
        "gpus",
        "tp",
        "pp",
        "cp",
        "virtual_stages",
        "micro_batch",
        "grad_accum",
        "global_batch",
    )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ints:
            r[k] = int(r[k])
        r["measured"] = float(r["measured"])
    return rows


def why_inexpressible(row: dict) -> str:
    """'' if the simulator can state the run, else every reason it cannot ("; "-joined)."""
    reasons = []
    if row["gpu"] not in HARDWARE:
        reasons.append(
            f"hardware {row['gpu']!r} has no preset"
            + (
                " (the source: H100 at a 500 W limit with HBM2e, whose peak FLOP/s it says it does not know)"
                if row["gpu"].startswith("h100_96")
                else " (the source gives its fabric's Gb/s without saying per GPU or per node: Hardware.with_fabric "
                "needs which)"
                if row["gpu"].endswith("gbps")
                else ""
            )
        )
    if "compile" in row["note"]:
        reasons.append("torch.compile's kernel fusion is not in the cost model")
    if row["cpu_offload"] == "True":
        reasons.append("activation CPU offload without the number of layers offloaded (Strategy.offload_layers)")
    if row["precision"] not in PRECISION or row["sharding"] not in SHARDING or row["recompute"] not in RECOMPUTE:
        reasons.append(
            f"precision/sharding/recompute {row['precision']}/{row['sharding']}/{row['recompute']} not modelled"
        )
    return "; ".join(reasons)


def model_of(row: dict):
    return transformer(
        row["layers"],
        row["hidden"],
        row["heads"],
        row["seq_len"],
        row["vocab"],
        kv_heads=row["kv_heads"],
        ffn_hidden=row["ffn_hidden"],
        gated_mlp=bool(row["gated_mlp"]),
        tied_embeddings=bool(row["tied_embeddings"]),
        norm=row["norm"],
        position=row["position"],
        bias=bool(row["bias"]),
        dropout=bool(row["dropout"]),
        name=row["model"],
    )


def strategy_of(row: dict) -> Strategy:
    dp = row["gpus"] // (row["tp"] * row["pp"] * row["cp"])
    return Strategy(
        dp=dp,
        tp=row["tp"],
        pp=row["pp"],
        cp=row["cp"],
        cp_kind="ring",
        micro_batch=row["micro_batch"],
        num_micro_batches=row["global_batch"] // (dp * row["micro_batch"]),
        zero_stage=SHARDING[row["sharding"]],
        fsdp=True,
        recompute=RECOMPUTE[row["recompute"]],
        attention=ATTENTION[row["attention"]],
        dtype=PRECISION[row["precision"]],
        reduce_dtype=REDUCE.get(row["fsdp_mixed_precision"], ""),
        overlap=True,
        kernels=KERNELS.get(row["source"], "fused"),
        schedule=row["schedule"] if row["pp"] > 1 else "1f1b",
        tp_across_nodes=False,
    )


def predict_row(row: dict, hardware=None) -> dict:
    """One CSV row predicted: the row's identity and inputs, measured and predicted tokens/s per GPU, error."""
    out = dict(
        id=row["id"],
        split=row["split"],
        source=row["source"],
        table=row["table"],
        model=row["model"],
        gpu=row["gpu"],
        gpus=row["gpus"],
        seq_len=row["seq_len"],
        tp=row["tp"],
        pp=row["pp"],
        micro_batch=row["micro_batch"],
        precision=row["precision"],
        recompute=row["recompute"],
        sharding=row["sharding"],
        measured=row["measured"],
        metric=row["metric"],
    )
    reason = why_inexpressible(row)
    out.update(
        expressible=not reason,
        reason=reason,
        predicted=None,
        error=None,
        fits=None,
        memory_gb=None,
        params_b=None,
        mfu=None,
        mfu_measured=None,
        exposed_comm_share=None,
    )
    if reason:
        return out
    model, s = model_of(row), strategy_of(row)
    if hardware is None and row["gpu"] == "h100_80gb":
        hardware = dgx_h100(H100_SOFTWARE.get(row["source"], "today"))
    hw = hardware or HARDWARE[row["gpu"]]()
    p = predict(model, hw, s)
    tokens_per_gpu = s.global_batch * model.seq_len / p.step_time / row["gpus"]
    out.update(
        predicted=tokens_per_gpu,
        error=tokens_per_gpu / row["measured"] - 1,
        fits=p.fits,
        memory_gb=p.memory["total"] / 1e9,
        params_b=model.params / 1e9,
        mfu=p.mfu,
        mfu_measured=measured_mfu(model, hw, s, p, tokens_per_gpu / row["measured"] - 1),
        exposed_comm_share=p.exposed_comm / p.step_time,
    )
    return out


def measured_mfu(model, hardware, strategy, prediction, error: float) -> float:
    """The MFU the run measured (the simulator's definition: model FLOPs, backward = 2 × forward, over the peak of
    the run's dtype): the MFU the prediction has were it to run, over (1 + error)."""
    s = strategy
    mfu = model.flops_per_sample() * s.global_batch / (prediction.step_time * s.world_size * hardware.peak(s.dtype))
    return mfu / (1 + error)


def megatron_rows(hardware=None) -> list[dict]:
    """Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 in the same row form (their own predictors)."""
    hw = hardware or dgx_a100()
    rows = []
    for i, run in enumerate(NARAYANAN_2021_TABLE_1):
        model, s = run.model(), run.strategy()
        p = predict(model, hw, s)
        predicted = run.paper_flops() / (p.step_time * run.gpus) / 1e12
        rows.append(
            dict(
                id=f"narayanan2021-{i:03d}",
                split="fit" if i % 2 == 0 else "test",
                source="Narayanan 2021",
                table="Table 1",
                model=f"GPT {run.label}",
                gpu="a100_80gb",
                gpus=run.gpus,
                seq_len=2048,
                tp=run.tp,
                pp=run.pp,
                micro_batch=run.micro_batch,
                precision="fp16",
                recompute="full",
                sharding="none",
                measured=float(run.tflops),
                metric="tflops_per_gpu",
                expressible=True,
                reason="",
                predicted=predicted,
                error=predicted / run.tflops - 1,
                fits=p.fits,
                memory_gb=p.memory["total"] / 1e9,
                params_b=model.params / 1e9,
                mfu=p.mfu,
                mfu_measured=measured_mfu(model, hw, s, p, predicted / run.tflops - 1),
                exposed_comm_share=p.exposed_comm / p.step_time,
            )
        )
    for i, run in enumerate(KORTHIKANTI_2022):
        model, s = run.model(), run.strategy()
        p = predict(model, hw, s)
        rows.append(
            dict(
                id=f"korthikanti2022-{i:03d}",
                split="fit" if i % 2 == 0 else "test",
                source="Korthikanti 2022",
                table="Table 5",
                model=f"GPT {run.label} ({run.mode})",
                gpu="a100_80gb",
                gpus=run.tp * run.pp,
                seq_len=2048,
                tp=run.tp,
                pp=run.pp,
                micro_batch=run.micro_batch,
                precision="fp16",
                recompute="full" if run.mode == "full" else "selective",
                sharding="none",
                measured=run.seconds,
                metric="iteration_s",
                expressible=True,
                reason="",
                predicted=p.step_time,
                error=run.seconds / p.step_time - 1,
                fits=p.fits,
                memory_gb=p.memory["total"] / 1e9,
                params_b=model.params / 1e9,
                mfu=p.mfu,
                mfu_measured=measured_mfu(model, hw, s, p, run.seconds / p.step_time - 1),
                exposed_comm_share=p.exposed_comm / p.step_time,
            )
        )
    return rows


def validation_table(path: Path = DATA):
    """Every published run, predicted: a DataFrame, one row per run (expressible or not, with the reason)."""
    import pandas as pd

    return pd.DataFrame([predict_row(r) for r in load_rows(path)] + megatron_rows())


def summary(table, by: str = "source"):
    """Mean and max |error|, rows and rows that do not fit, per group of the expressible rows, both halves."""
    import pandas as pd

    ok = table[table.expressible].copy()
    ok["abs_error"] = ok["error"].astype(float).abs()
    out = []
    for (group, split), g in ok.groupby([by, "split"]):
        out.append(
            dict(
                group=group,
                split=split,
                rows=len(g),
                mean_abs_error=g.abs_error.mean(),
                max_abs_error=g.abs_error.max(),
                mean_error=g["error"].astype(float).mean(),
                not_fitting=int((~g.fits.astype(bool)).sum()),
            )
        )
    return pd.DataFrame(out)
