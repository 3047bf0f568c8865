"""Published GPU-cluster runs the simulator is checked against (one source for lesson 09c, benchmarks/sim_validation.ipynb and the benchmark).

**Narayanan et al. 2021**, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
(SC'21, arXiv 2104.04473), Table 1: GPT models of 1.7B to 1T parameters on 32 to 3,072 A100 80 GB GPUs of
NVIDIA's Selene (DGX A100 nodes, 8 GPUs on NVSwitch, 8 HDR InfiniBand NICs per node), fp16, sequence 2048,
vocabulary 51,200, full activation recomputation, achieved teraFLOP/s per GPU.

- Model shapes, tp, pp, GPUs (8 × nodes), global batch, micro-batch, interleaving and the data-parallel wrapper
  are read from Megatron-LM's own script for that table, ``examples/sc21/run_table_1.sh`` (NVIDIA/Megatron-LM;
  ``--num-layers-per-virtual-pipeline-stage n`` gives v = layers / (pp · n); ``DDP=torch`` is PyTorch DDP,
  which overlaps the gradient all-reduce with backward, ``DDP=local`` Megatron's own, which does not).
- Achieved TFLOP/s per GPU, % of peak and parameter counts are transcribed from the paper's Table 1. They could
  not be checked against a stored copy of the paper here; they are internally consistent (TFLOP/s × GPUs = the
  table's aggregate PFLOP/s to within rounding), and the 1T row's 502 PFLOP/s aggregate (163 per GPU) matches
  independent summaries of the paper.
- The paper counts FLOPs with its eq. (3), F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, which
  includes the recomputed forward; predicted TFLOP/s per GPU = F / (predicted iteration time × GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from .collectives import ring_all_reduce
from .cost import predict
from .hardware import Link
from .hardware_presets import AZURE_A100_80GB_ALLREDUCE, dgx_a100
from .model_zoo import gpt
from .strategy import Strategy

SOURCE = (
    "Narayanan et al. 2021, SC'21 (arXiv 2104.04473), Table 1; configurations from NVIDIA/Megatron-LM "
    "examples/sc21/run_table_1.sh"
)


@dataclass(frozen=True)
class MegatronRun:
    """One row of Narayanan et al. 2021, Table 1 (with its run_table_1.sh settings)."""

    label: str
    params_b: float  # billions, as printed in the paper
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    micro_batch: int  # run_table_1.sh MBS
    layers_per_chunk: int  # --num-layers-per-virtual-pipeline-stage (0: not interleaved)
    ddp: str  # "torch" (overlapped) or "local"
    tflops: float  # achieved teraFLOP/s per GPU (published)
    percent_peak: int  # published % of theoretical peak

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def virtual_stages(self) -> int:
        return self.layers // (self.pp * self.layers_per_chunk) if self.layers_per_chunk else 1

    def model(self, seq_len: int = 2048, vocab: int = 51200):
        return gpt(self.layers, self.hidden, self.heads, seq_len=seq_len, vocab=vocab, name=f"GPT {self.label}")

    def strategy(self):
        v = self.virtual_stages
        return Strategy(
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            micro_batch=self.micro_batch,
            num_micro_batches=self.num_micro_batches,
            recompute="full",
            dtype="fp16",
            schedule="interleaved" if v > 1 else "1f1b",
            virtual_stages=v,
            overlap=self.ddp == "torch",
            sequence_parallel=False,
        )

    def paper_flops(self, seq_len: int = 2048, vocab: int = 51200) -> float:
        """FLOPs per iteration by the paper's eq. (3) (recomputation included)."""
        B, s, L, h, V = self.global_batch, seq_len, self.layers, self.hidden, vocab
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


# label, params (B), heads, hidden, layers, tp, pp, GPUs, batch, MBS, layers per virtual stage, DDP, TFLOP/s, %
NARAYANAN_2021_TABLE_1 = [
    MegatronRun("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 0, "torch", 137, 44),
    MegatronRun("3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 0, "torch", 138, 44),
    MegatronRun("7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 0, "torch", 142, 46),
    MegatronRun("18B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 0, "torch", 135, 43),
    MegatronRun("39B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 0, "local", 138, 44),
    MegatronRun("76B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 5, "local", 140, 45),
    MegatronRun("145B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 5, "local", 148, 47),
    MegatronRun("310B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 3, "local", 155, 50),
    MegatronRun("530B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 1, "local", 163, 52),
    MegatronRun("1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 0, "local", 163, 52),
]


def predict_run(run: MegatronRun, hardware=None) -> dict:
    """One Table 1 row predicted on ``hardware`` (default: the DGX A100 preset): a dict with the published and
    predicted TFLOP/s per GPU, the relative error and where the predicted iteration time goes."""

    hardware = hardware or dgx_a100()
    model, s = run.model(), run.strategy()
    p = predict(model, hardware, s)
    predicted = run.paper_flops() / (p.step_time * run.gpus) / 1e12 if p.fits else None
    b = p.breakdown
    return dict(
        model=run.label,
        params_b_paper=run.params_b,
        params_b_formula=model.params / 1e9,
        layers=run.layers,
        hidden=run.hidden,
        heads=run.heads,
        tp=run.tp,
        pp=run.pp,
        dp=run.dp,
        gpus=run.gpus,
        global_batch=run.global_batch,
        micro_batch=run.micro_batch,
        micro_batches=run.num_micro_batches,
        virtual_stages=run.virtual_stages,
        ddp=run.ddp,
        published_tflops=run.tflops,
        published_percent_peak=run.percent_peak,
        predicted_tflops=predicted,
        error=(predicted / run.tflops - 1) if predicted else None,
        step_s=p.step_time,
        compute_s=p.compute,
        tp_comm_s=b["tp_comm"],
        pp_comm_s=b["pp_comm"],
        pp_messages=b["pp_messages"],
        dp_exposed_s=b["dp_exposed"],
        embedding_sync_s=b["embedding_sync"],
        bubble_s=p.bubble,
        optimizer_s=p.optimizer,
        memory_gb=p.memory["total"] / 1e9,
        fits=p.fits,
    )


def published_table(hardware=None):
    """Every row of Narayanan et al. 2021 Table 1, predicted: a DataFrame, one row each."""
    import pandas as pd

    return pd.DataFrame([predict_run(run, hardware) for run in NARAYANAN_2021_TABLE_1])


def nccl_points(hardware=None, world_size: int = 8):
    """The published nccl-tests all-reduce bus bandwidths the A100 preset's intra-node link is built from, beside
    what the link model gives at the same sizes: the curve it reads (exact by construction) and the α-β fit."""
    import pandas as pd

    hardware = hardware or dgx_a100()
    n = world_size
    fit = Link(hardware.intra.alpha, hardware.intra.bandwidth)
    rows = []
    for size, busbw in AZURE_A100_80GB_ALLREDUCE:
        factor = 2 * (n - 1) / n
        curve = factor * size / ring_all_reduce(size, n, hardware.intra) / 1e9
        line = factor * size / ring_all_reduce(size, n, fit) / 1e9
        rows.append(
            dict(
                size_bytes=size,
                published_busbw_GBps=busbw,
                model_busbw_GBps=curve,
                alpha_beta_fit_busbw_GBps=line,
                fit_error=line / busbw - 1,
            )
        )
    return pd.DataFrame(rows)


# ───────────────────────── an independent check: Korthikanti et al. 2022 ─────────────────────────


@dataclass(frozen=True)
class KorthikantiRun:
    """Iteration time of one run of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models" (arXiv 2205.05198): A100s, one data-parallel replica, fp16, sequence 2048.

    The times (seconds per iteration) are the paper's as quoted by Calculon (calculon-ai/calculon,
    ``calculon/megatron/validation.py``); the parallel layouts and batch sizes are Calculon's
    ``validation/<model>_full.json`` and ``_seqsel.json``, the shapes its ``examples/<model>.json``.
    ``mode``: "full" — full recomputation, no sequence parallelism; "seqsel" — selective recomputation with
    sequence parallelism (the all-gather redone in backward). Vocabulary 51,200 is assumed (not in those files).
    """

    label: str
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    global_batch: int
    micro_batch: int
    virtual_stages: int
    mode: str
    seconds: float

    def model(self):
        return gpt(self.layers, self.hidden, self.heads, seq_len=2048, vocab=51200, name=f"GPT {self.label}")

    def strategy(self):
        v = self.virtual_stages
        return Strategy(
            tp=self.tp,
            pp=self.pp,
            micro_batch=self.micro_batch,
            num_micro_batches=self.global_batch // self.micro_batch,
            dtype="fp16",
            recompute="full" if self.mode == "full" else "selective",
            sequence_parallel=self.mode == "seqsel",
            schedule="interleaved" if v > 1 else "1f1b",
            virtual_stages=v,
        )


KORTHIKANTI_2022 = [
    KorthikantiRun(label, L, h, a, tp, pp, B, mb, v, mode, t)
    for label, L, h, a, tp, pp, B, mb, v, times in [
        ("22B", 48, 6144, 64, 8, 1, 4, 4, 1, (1.42, 1.10)),
        ("175B", 96, 12288, 96, 8, 8, 64, 1, 3, (18.13, 13.75)),
        ("530B", 105, 20480, 128, 8, 35, 280, 1, 3, (49.05, 37.83)),
        ("1T", 128, 25600, 160, 8, 64, 512, 1, 1, (94.42, 71.49)),
    ]
    for mode, t in zip(("full", "seqsel"), times)
]


def korthikanti_table(hardware=None):
    """Korthikanti et al. 2022's iteration times beside the predicted ones (nothing fitted to them)."""
    import pandas as pd

    hardware = hardware or dgx_a100()
    rows = []
    for run in KORTHIKANTI_2022:
        p = predict(run.model(), hardware, run.strategy())
        rows.append(
            dict(
                model=run.label,
                mode=run.mode,
                tp=run.tp,
                pp=run.pp,
                gpus=run.tp * run.pp,
                global_batch=run.global_batch,
                virtual_stages=run.virtual_stages,
                published_s=run.seconds,
                predicted_s=p.step_time if p.fits else None,
                error=(p.step_time / run.seconds - 1) if p.fits else None,
                memory_gb=p.memory["total"] / 1e9,
                fits=p.fits,
            )
        )
    return pd.DataFrame(rows)
