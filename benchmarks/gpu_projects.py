"""The GPU check's projects: each project at its GPU size (``simlib train <p> --size gpu``) for a fixed training
time, its step time, throughput and MFU against the datasheet peak, and the simulator's prediction of the same run
(a ``--dry-run`` on the preset of the GPU it runs on) beside the measured step.

A run killed at its budget still leaves a row: its ``run.jsonl`` (written as each logged step ends) is read back
into a ``summary.json`` marked ``partial`` (:func:`summary_from_log`), so the last measurement is never lost."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from gpu_jobs import finish, install_hint, missing, start

from simlib.projects.registry import PROJECTS as REGISTERED  # noqa: E402 - gpu_check put this clone on sys.path

PROJECTS = tuple(REGISTERED)  # every registered project, at its GPU size (or its full size, said so)
TRAIN_SECONDS = 20  # each project trains this long at its GPU size (--budget.seconds): enough for a steady step
# Seconds of work besides the training (measured on the H200, 2026-12-04, and the GPT's compile on this CPU,
# scaled): start-up (import torch, CUDA context, data) and, for the GPT, torch.compile of one block (forward and
# backward) and the samples. A project's budget is (TRAIN_SECONDS + this) x 1.3 or more: a 30 % margin.
WORK_BESIDES_TRAINING = {"gpt": 60, "vision": 15, "finance": 12}
WORK_BESIDES_TRAINING.update({name: 15 for name in PROJECTS if name not in WORK_BESIDES_TRAINING})  # a new project
MARGIN = 1.3
BUDGETS = {name: round((TRAIN_SECONDS + extra) * MARGIN + 0.5) for name, extra in WORK_BESIDES_TRAINING.items()}
EXTRAS = ("arch", "sklearn", "tokenizers")
NO_SIZE = re.compile(r"unrecognized arguments:.*--size|argument --size: invalid choice")
PREDICTED = re.compile(r"predicted step on ([^:]+): ([0-9.]+(?:e[-+]?[0-9]+)?) ms")
SUMMARY_KEYS = (
    "device",
    "plan_label",
    "steps",
    "step_time",
    "samples_per_s",
    "tokens_per_s",
    "mfu",
    "mfu_peak",
    "mfu_peak_source",
    "mfu_peak_flops",
    "large_gemm_tflops_per_gpu",
    "peak_memory_bytes",
    "final_eval",
    "compiled",
    "dtype",
    "flops_per_token",
    "partial",
)


def project_commands(
    name: str, out_dir: str, py: str = sys.executable, hardware: str = "h200", size: str = "gpu", seconds=None
) -> dict:
    """The training run and the dry run that predicts it on ``hardware`` (the preset of the GPU it runs on:
    ``simlib.debug.mfu.preset_for``). ``size``/``seconds``: what a CPU test runs the same commands at."""
    base = [py, "-m", "simlib", "train", name, "--size", size, "--world-size", "1"]
    seconds = TRAIN_SECONDS if seconds is None else seconds
    return {
        "train": base + ["--budget.seconds", str(seconds), "--budget.eval-every", "0", "--out", out_dir],
        "predict": base + ["--dry-run", "--hardware", hardware],
    }


def summary_from_log(out_dir) -> dict | None:
    """A run killed before it wrote ``summary.json``: its throughput from the logged steps of ``run.jsonl``
    (tokens or samples over training time between the first and the last logged step: the warm-up left out),
    written as ``summary.json`` with ``partial`` saying so. None when nothing was logged."""
    log = Path(out_dir) / "run.jsonl"
    if not log.exists():
        return None
    rows = []
    for line in log.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written when the run was killed
        if "step" in row and "train_time" in row and "eval" not in row:
            rows.append(row)
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    seconds = last["train_time"] - first["train_time"]
    summary = {"steps": last["step"] + 1, "partial": "killed at its budget: read back from run.jsonl"}
    if seconds > 0:
        summary["step_time"] = seconds / (last["step"] - first["step"])
        summary["samples_per_s"] = (last["samples"] - first["samples"]) / seconds
        if "tokens" in last and "tokens" in first:
            summary["tokens_per_s"] = (last["tokens"] - first["tokens"]) / seconds
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def read_project(name: str, train: dict, predict: dict, out_dir) -> dict:
    """One project's row: the run's status, step time, throughput and MFU (with which peak), and the simulator's
    predicted step beside the measured one."""
    row = {k: v for k, v in train.items() if k != "output"}
    if train["status"] != "passed" and NO_SIZE.search(train.get("output", "")):
        row.update(
            status="skipped",
            error="this simlib has no `simlib train <project> --size gpu` (issue 37 part 2 "
            "adds it): nothing to measure at a GPU size; update the clone",
        )
        return row
    summary_file = Path(out_dir) / "summary.json"
    if summary_file.exists():
        s = json.loads(summary_file.read_text())
    else:
        s = summary_from_log(out_dir) or {}
    row.update({k: s.get(k) for k in SUMMARY_KEYS if k in s})
    if s.get("tokens_per_s") and s.get("flops_per_token") and s.get("mfu_peak_flops"):
        row["model_tflops"] = s["tokens_per_s"] * s["flops_per_token"] / 1e12
    match = PREDICTED.search(predict.get("output", ""))
    row["prediction"] = {"command": predict["command"], "status": predict["status"]}
    if match:
        row["prediction"].update(hardware=match.group(1), step_time=float(match.group(2)) / 1e3)
        if row.get("step_time"):
            row["prediction"]["measured_over_predicted"] = row["step_time"] / row["prediction"]["step_time"]
    else:
        row["prediction"]["error"] = "no 'predicted step on ...' line: " + predict.get("output", "")[-600:]
    return row


def projects_section(tmp: Path, projects=PROJECTS, hardware: str = "h200") -> dict:
    lacking = missing(EXTRAS)
    rows = {}
    for name in projects:
        out_dir = tmp / f"project_{name}"
        cmds = project_commands(name, str(out_dir), hardware=hardware)
        print(f"gpu_check: project {name} at its GPU size ({TRAIN_SECONDS} s of training) ...", flush=True)
        jobs = {k: start(cmd) for k, cmd in cmds.items()}  # the prediction (a dry run, CPU) beside the training
        train, predict = (finish(jobs[k], BUDGETS[name]) for k in ("train", "predict"))
        rows[name] = read_project(name, train, predict, out_dir)
        print(f"gpu_check: project {name} {rows[name]['status']} in {train['seconds']} s", flush=True)
    statuses = {r["status"] for r in rows.values()}
    status = "passed" if statuses == {"passed"} else "skipped" if statuses == {"skipped"} else "failed"
    out = {"status": status, "projects": rows, "train_seconds": TRAIN_SECONDS, "hardware": hardware}
    if lacking and status != "passed":
        out["hint"] = f"missing {', '.join(lacking)}: {install_hint(lacking)}"
    return out
