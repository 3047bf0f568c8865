"""The run record: what :func:`simlib.train.train` writes and returns, and what plots and checks read.

    out_dir/run.jsonl     one JSON object per logged step {"step", "loss", "samples", "tokens", "lr",
                          "step_time", "spans": {"forward", "backward", "comm", "optimizer", "wait"},
                          "grad_norm", "train_time"} (and "peak_memory" on the step it was measured),
                          and one per evaluation {"step", "eval": {...}, "tokens", "samples", "train_time"}
    out_dir/summary.json  plan, world size, threads, tokens/s (warm-up left out, median step), MFU (on a GPU
                          against its datasheet peak for the run's dtype, with a measured large GEMM beside
                          it; on a CPU against the measured matmul rate; "mfu_peak" says which), time and
                          tokens to the target, final eval

``RunRecord.load(out_dir)`` reads them back (for plots, and for graders that recompute what they check).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path


def step_row(step, loss, state, lr, step_time, timeline, grad_norm, tokens_per_sample) -> dict:
    """One logged step: the loss over the global batch, counters, and this rank's span totals."""
    spans = {}
    for r in timeline._rows:  # this rank's spans of this step (the timeline keeps them in order)
        if r["step"] == step and r["kind"] != "step" and r["duration"] is not None:
            spans[r["kind"]] = spans.get(r["kind"], 0.0) + r["duration"]
    row = {
        "step": step,
        "loss": loss,
        "samples": state.samples,
        "lr": lr,
        "step_time": step_time,
        "spans": spans,
        "train_time": state.train_time,
    }
    if tokens_per_sample:
        row["tokens"] = state.tokens
    if grad_norm is not None:
        row["grad_norm"] = grad_norm
    return row


def time_to_target(evals, target: dict | None) -> dict:
    """The first evaluation at which every metric of ``target`` is reached (losses: <=, others: >=)."""
    if not target:
        return {}
    for e in evals:
        if all(k in e["eval"] and (e["eval"][k] <= v if "loss" in k else e["eval"][k] >= v) for k, v in target.items()):
            return {
                "target_reached": True,
                "time_to_target": e["train_time"],
                "tokens_to_target": e["tokens"],
                "samples_to_target": e["samples"],
                "step_to_target": e["step"],
            }
    return {"target_reached": False, "time_to_target": None, "tokens_to_target": None}


def build_summary(task, plan, ctx, state, timeline, rows, evals, target, peak_memory, matmul_rate, wall_time) -> dict:
    """The summary (same on every rank): throughput from the median step, MFU, target, final eval."""
    import torch
    import torch.distributed as dist

    from .timeline import summarize

    tokens_per_sample = getattr(task, "tokens_per_sample", 0) or 0
    try:
        timing = summarize(timeline)
    except ValueError:  # fewer steps than the warm-up: no throughput to report
        timing = {}
    # every rank's peak memory, matmul rate and, on a GPU, that GPU's peak (MFU compares with their sum)
    gpu = None
    if ctx.device.type == "cuda":
        from . import hooks

        try:
            gpu = {
                **hooks.tool("peaks").device_peak(ctx.device, plan.mixed_precision),
                "where": [socket.gethostname(), str(ctx.device)],
            }
        except Exception as exc:  # noqa: BLE001 - MFU is a report: a failed yardstick must not lose the run
            import warnings

            warnings.warn(
                f"MFU: the GPU's peak could not be read or measured ({exc}); MFU uses the measured "
                "512^3 matmul instead",
                stacklevel=2,
            )
    mine = [peak_memory, matmul_rate, gpu]
    everyone = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    peaks = [p for p, _, _ in everyone if p is not None]
    step_time = timing.get("step_time")
    summary = {
        "task": task.name,
        "plan": asdict(plan),
        "plan_label": plan.label,
        "world_size": ctx.world_size,
        "threads": torch.get_num_threads(),
        "device": str(ctx.device),
        "backend": ctx.backend,
        "global_batch": task.global_batch,
        "tokens_per_sample": tokens_per_sample,
        "steps": state.step,
        "samples": state.samples,
        "tokens": state.tokens,
        "train_time": state.train_time,
        "wall_time": wall_time,
        "step_time": step_time,
        "step_time_iqr": timing.get("step_time_iqr"),
        "samples_per_s": task.global_batch / step_time if step_time else None,
        "tokens_per_s": task.global_batch * tokens_per_sample / step_time if step_time and tokens_per_sample else None,
        "forward_time": timing.get("forward_time"),
        "backward_time": timing.get("backward_time"),
        "optimizer_time": timing.get("optimizer_time"),
        "comm_time": timing.get("comm_time"),
        "wait_time": timing.get("wait_time"),
        "exposed_comm_time": timing.get("exposed_comm_time"),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_by_rank": [p for p, _, _ in everyone],
        "matmul_gflops_per_rank": [r / 1e9 for _, r, _ in everyone],
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_eval": evals[-1]["eval"] if evals else None,
        "target": target,
    }
    flops = getattr(task, "flops_per_sample", None)
    if flops and step_time:
        summary["mfu_flops"] = f"{type(task).__name__}.flops_per_sample = {flops:.4g} per sample"
        gpus = {tuple(g["where"]): g for _, _, g in everyone if g}  # each GPU once, however many ranks share it
        if gpus:
            peak = sum(g["peak"] for g in gpus.values())
            first = next(iter(gpus.values()))
            summary["mfu_peak"] = first["text"] + (f"; x {len(gpus)} GPUs" if len(gpus) > 1 else "")
            summary["mfu_peak_source"] = first["source"]
            summary["mfu_peak_flops"] = peak
            summary["large_gemm_tflops_per_gpu"] = [g["measured_large_gemm"] / 1e12 for g in gpus.values()]
        else:  # a CPU: this process's measured matmul rate is the honest peak
            peak = sum(r for _, r, _ in everyone)
            summary["mfu_peak"] = (
                "measured: the best of 5 512^3 matmuls on each rank with its threads ("
                + ("fp32 and " + plan.mixed_precision if plan.mixed_precision else "fp32")
                + "), summed over ranks"
            )
            summary["mfu_peak_source"] = "measured"
            summary["mfu_peak_flops"] = peak
        summary["mfu"] = flops * task.global_batch / step_time / peak
    summary.update(time_to_target(evals, target))
    return summary


class RecordWriter:
    """Rank 0's run record on disk: JSON lines as they come (a killed run keeps them), the summary at the end."""

    def __init__(self, out_dir, append: bool = False):
        self.dir = Path(out_dir) if out_dir is not None else None
        self.file = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.file = open(self.dir / "run.jsonl", "a" if append else "w")

    def write(self, row: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def finish(self, summary: dict) -> None:
        if self.file is not None:
            self.file.close()
            (self.dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


@dataclass
class RunRecord:
    """What a run produced: logged steps, evaluations, summary (and, in the process that trained, the
    gathered timeline and the trained model's :class:`simlib.parallelize.ParallelModel`)."""

    rows: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    timeline: object = None
    model: object = None

    @property
    def frame(self):
        """The logged steps as a DataFrame (span totals as ``<kind>_time`` columns)."""
        import pandas as pd

        df = pd.DataFrame([{k: v for k, v in r.items() if k != "spans"} for r in self.rows])
        for kind in ("forward", "backward", "comm", "optimizer", "wait"):
            df[f"{kind}_time"] = [r.get("spans", {}).get(kind, 0.0) for r in self.rows]
        return df

    @property
    def eval_frame(self):
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "step": e["step"],
                    "tokens": e.get("tokens"),
                    "samples": e.get("samples"),
                    "train_time": e.get("train_time"),
                    **e["eval"],
                }
                for e in self.evals
            ]
        )

    def __getstate__(self):  # sent back from a worker: the model (it holds process groups) stays there
        return {**self.__dict__, "model": None}

    @classmethod
    def load(cls, out_dir) -> RunRecord:
        out_dir = Path(out_dir)
        rows, evals = [], []
        for line in (out_dir / "run.jsonl").read_text().splitlines():
            obj = json.loads(line)
            (evals if "eval" in obj else rows).append(obj)
        summary_path = out_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return cls(rows, evals, summary)
