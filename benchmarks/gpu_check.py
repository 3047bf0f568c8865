"""The GPU check: run what the course promises on a machine with NVIDIA GPUs, in 8 minutes, and write one JSON.

    python benchmarks/gpu_check.py                 # no arguments: every section, results/gpu_check.json
    python benchmarks/gpu_check.py --dry           # print the plan (sections, commands, budgets); run nothing
    python benchmarks/gpu_check.py --skip notebooks --out /tmp/check.json

**Fits 8 minutes by design.** Every section has a time budget (:data:`BUDGETS`) and is killed at it, recorded as
failed with the tail of its output; one broken part never hides the others. First, alone on the GPU (these are
measurements): ``calibration`` (GEMM TFLOP/s by shape and dtype, HBM bandwidth, beside ``sim.dgx_h200()``),
``projects`` (each project at its GPU size, ``simlib train <p> --size gpu``, for a fixed training time: step time,
throughput, MFU against the datasheet peak, and the simulator's prediction of the same run on ``dgx_h200`` from
``--dry-run`` beside the measured step), ``torchrun`` (``torchrun --nproc-per-node <GPUs>`` with NCCL on every
GPU). Then, side by side: ``notebooks`` (every lesson notebook in quick mode, each in its own kernel with its own
budget, every cell recorded -- a failing cell's traceback is in the JSON; ``benchmarks/gpu_notebooks.py``),
``gpu_tests`` (tests/test_gpu.py), ``device_guard`` (tests/test_device_guard.py) and ``scaling``
(``simlib scaling --quick``; every world size on the same kind of device).

**From a fresh clone.** It needs torch and the course's own dependencies; what the dev extras add is checked
first (:data:`EXTRAS`): a section that lacks one is recorded as skipped with the ``pip install`` line that fixes
it, and the others run. Without a GPU it says so and records every section as skipped (exit 0): it is the check to
run when a machine with a GPU is lent (``bash tests/gpu_check.sh``), not a CI test; ``tests/test_gpu_check.py``
tests its pieces on the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

TOTAL_BUDGET = 480  # seconds: the whole check, on one GPU
# sequential sections (alone on the GPU), then the side-by-side ones; a project's budget is its own run
BUDGETS = {"calibration": 30, "project": 55, "torchrun": 75, "side_by_side": 200}
from simlib.projects.registry import PROJECTS as REGISTERED  # noqa: E402 - after sys.path names this clone

PROJECTS = tuple(REGISTERED)  # every registered project, at its GPU size (or its full size, said so)
TRAIN_SECONDS = 20  # each project trains this long at its GPU size (--budget.seconds): enough for a steady step
EXTRAS = {"notebooks": ("nbclient", "nbformat", "ipykernel", "ipywidgets", "matplotlib"),
          "gpu_tests": ("pytest",), "device_guard": ("pytest",), "projects": ("arch", "sklearn", "tokenizers")}
GEMM_SHAPES = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (2048, 12288, 4096),
               (16384, 1024, 4096), (512, 512, 512)]  # (m, k, n): square, a GPT-style MLP, skinny, tiny


def planned_seconds(projects=PROJECTS) -> int:
    """The longest the check can take: the sum of its budgets (what :data:`TOTAL_BUDGET` bounds)."""
    return (BUDGETS["calibration"] + len(projects) * BUDGETS["project"] + BUDGETS["torchrun"]
            + BUDGETS["side_by_side"])


def missing(modules) -> list[str]:
    import importlib.util
    return [m for m in modules if importlib.util.find_spec(m) is None]


def install_hint(modules) -> str:
    names = {"sklearn": "scikit-learn"}
    return "pip install " + " ".join(names.get(m, m) for m in modules)


# ---- running commands under a budget ----
def start(cmd, env=None, cwd=ROOT):
    """A command in a session of its own (so a budget kills it and all its children), output to a temp file."""
    out = tempfile.TemporaryFile(mode="w+")
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])  # this clone's simlib
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": path, **(env or {})})
    return {"proc": proc, "out": out, "cmd": cmd, "t0": time.monotonic()}


def finish(job, budget: float) -> dict:
    """Wait for ``job`` until ``budget`` seconds after its start; kill its session past it. A record of it."""
    proc = job["proc"]
    try:
        proc.wait(timeout=max(0.1, job["t0"] + budget - time.monotonic()))
        status = "passed" if proc.returncode == 0 else "failed"
        note = ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        status, note = "failed", f"killed at its budget of {budget:.0f} s\n"
    job["out"].seek(0)
    text = job["out"].read()
    job["out"].close()
    return {"status": status, "returncode": proc.returncode, "seconds": round(time.monotonic() - job["t0"], 1),
            "budget": budget, "command": " ".join(map(str, job["cmd"])), "output_tail": note + text[-4000:],
            "output": text}


def run(cmd, budget: float, env=None) -> dict:
    record = finish(start(cmd, env), budget)
    record.pop("output")
    return record


# ---- calibration ----
def device_rates(device: str = "cuda") -> dict:
    """GEMM TFLOP/s by shape (bf16 and fp32) and memory bandwidth on ``device``, timed with CUDA events."""
    import torch

    def timed(fn, repeats=20, warmup=3):
        for _ in range(warmup):
            fn()
        start_, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeats):
            start_.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start_.elapsed_time(end) / 1e3)
        return sorted(times)[len(times) // 2]

    gemms = []
    for dtype in (torch.bfloat16, torch.float32):
        for m, k, n in GEMM_SHAPES:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = timed(lambda: a @ b)  # noqa: F821 - a, b are deleted only after the timing
            gemms.append({"dtype": str(dtype).removeprefix("torch."), "m": m, "k": k, "n": n,
                          "seconds": t, "tflops": 2 * m * k * n / t / 1e12})
            del a, b
    x = torch.randn(512 << 20, device=device)  # 2 GiB: far beyond any L2
    y = torch.randn(512 << 20, device=device)
    t = timed(lambda: x.add_(y), repeats=10)  # noqa: F821 - deleted after the timing
    hbm = 3 * x.numel() * 4 / t  # read x, read y, write x
    del x, y
    torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    return {"device_name": props.name, "memory_gib": round(props.total_memory / 2 ** 30, 1),
            "multiprocessors": props.multi_processor_count, "gemms": gemms, "hbm_bytes_per_s": hbm}


def compare_with_presets(rates: dict) -> dict:
    """The measured rates beside the simulator's H200 preset (measured on an H200 once) and the datasheet."""
    from simlib import sim
    from simlib.debug.mfu import datasheet_peak

    hw = sim.dgx_h200()
    rows = []
    for g in rates["gemms"]:
        dtype = {"bfloat16": "bf16", "float32": "fp32"}[g["dtype"]]
        predicted = hw.gemm_rate(2 * g["m"] * g["k"] * g["n"] / 1e9, dtype) / 1e12
        rows.append({"dtype": dtype, "shape": [g["m"], g["k"], g["n"]], "measured_tflops": g["tflops"],
                     "dgx_h200_tflops": predicted, "measured_over_preset": g["tflops"] / predicted})
    best_bf16 = max(g["tflops"] for g in rates["gemms"] if g["dtype"] == "bfloat16")
    sheet = datasheet_peak(rates["device_name"], "bf16")
    return {"preset": hw.name, "gemms": rows, "measured_best_bf16_tflops": best_bf16,
            "datasheet_bf16_tflops": sheet / 1e12 if sheet else None,
            "measured_over_datasheet": best_bf16 / (sheet / 1e12) if sheet else None,
            "hbm_preset_bytes_per_s": hw.achievable_bandwidth(6 * 2 ** 30),
            "measured_hbm_over_preset": rates["hbm_bytes_per_s"] / hw.achievable_bandwidth(6 * 2 ** 30)}


def calibration() -> dict:
    t0 = time.monotonic()
    try:
        rates = device_rates()
        return {"status": "passed", "rates": rates, "vs_preset": compare_with_presets(rates),
                "seconds": round(time.monotonic() - t0, 1), "budget": BUDGETS["calibration"]}
    except Exception as exc:  # noqa: BLE001 - recorded, never hides the other sections
        return {"status": "failed", "error": repr(exc), "seconds": round(time.monotonic() - t0, 1)}


# ---- each project at its GPU size, with the simulator's prediction beside it ----
NO_SIZE = re.compile(r"unrecognized arguments:.*--size|argument --size: invalid choice")
PREDICTED = re.compile(r"predicted step on ([^:]+): ([0-9.]+(?:e[-+]?[0-9]+)?) ms")


def project_commands(name: str, out_dir: str, py: str = sys.executable) -> dict:
    base = [py, "-m", "simlib", "train", name, "--size", "gpu", "--world-size", "1"]
    return {"train": base + ["--budget.seconds", str(TRAIN_SECONDS), "--budget.eval-every", "0", "--out", out_dir],
            "predict": base + ["--dry-run", "--hardware", "h200"]}


def read_project(name: str, train: dict, predict: dict, out_dir) -> dict:
    """One project's row: the run's status, step time, throughput and MFU (with which peak), and the simulator's
    predicted step on dgx_h200 beside the measured one."""
    row = {k: v for k, v in train.items() if k != "output"}
    if train["status"] != "passed" and NO_SIZE.search(train.get("output", "")):
        row.update(status="skipped", error="this simlib has no `simlib train <project> --size gpu` (issue 37 part 2 "
                   "adds it): nothing to measure at a GPU size; update the clone")
        return row
    summary_file = Path(out_dir) / "summary.json"
    if summary_file.exists():
        s = json.loads(summary_file.read_text())
        row.update({k: s.get(k) for k in ("device", "plan_label", "steps", "step_time", "samples_per_s",
                                          "tokens_per_s", "mfu", "mfu_peak", "mfu_peak_source", "mfu_peak_flops",
                                          "large_gemm_tflops_per_gpu", "peak_memory_bytes", "final_eval")})
    match = PREDICTED.search(predict.get("output", ""))
    row["prediction"] = {"command": predict["command"], "status": predict["status"]}
    if match:
        row["prediction"].update(hardware=match.group(1), step_time=float(match.group(2)) / 1e3)
        if row.get("step_time"):
            row["prediction"]["measured_over_predicted"] = row["step_time"] / row["prediction"]["step_time"]
    else:
        row["prediction"]["error"] = "no 'predicted step on ...' line: " + predict.get("output", "")[-600:]
    return row


def projects_section(tmp: Path, projects=PROJECTS) -> dict:
    lacking = missing(EXTRAS["projects"])
    rows = {}
    for name in projects:
        out_dir = tmp / f"project_{name}"
        cmds = project_commands(name, str(out_dir))
        print(f"gpu_check: project {name} at its GPU size ({TRAIN_SECONDS} s of training) ...", flush=True)
        jobs = {k: start(cmd) for k, cmd in cmds.items()}  # the prediction (a dry run, CPU) beside the training
        train, predict = (finish(jobs[k], BUDGETS["project"]) for k in ("train", "predict"))
        rows[name] = read_project(name, train, predict, out_dir)
        print(f"gpu_check: project {name} {rows[name]['status']} in {train['seconds']} s", flush=True)
    status = "passed" if all(r["status"] == "passed" for r in rows.values()) else \
        "skipped" if all(r["status"] == "skipped" for r in rows.values()) else "failed"
    out = {"status": status, "projects": rows, "train_seconds": TRAIN_SECONDS}
    if lacking and status != "passed":
        out["hint"] = f"missing {', '.join(lacking)}: {install_hint(lacking)}"
    return out


# ---- side by side: notebooks, tests, scaling ----
def notebooks(folder=ROOT / "notebooks"):
    return sorted(Path(folder).glob("[0-9]*.ipynb"))


def side_by_side_jobs(tmp: Path, gpus: int, skip=(), py: str = sys.executable) -> dict:
    """The commands run side by side in the last phase (each killed at the phase's budget)."""
    budget = BUDGETS["side_by_side"] - 10  # a notebook's own budget: it writes its record before the phase ends
    jobs = {"gpu_tests": [py, "-m", "pytest", "tests/test_gpu.py", "-q", "-p", "no:nbval", "-p", "no:cacheprovider",
                          "-o", "addopts=", "-rs"],
            "device_guard": [py, "-m", "pytest", "tests/test_device_guard.py", "-q", "-p", "no:nbval", "-p",
                             "no:cacheprovider", "-o", "addopts="],
            "scaling": [py, "-m", "simlib", "scaling", "--quick", "--out", str(tmp / "scaling")]}
    for nb in notebooks():
        jobs[f"notebook {nb.stem}"] = [py, str(ROOT / "benchmarks" / "gpu_notebooks.py"), str(nb), "--budget",
                                       str(budget), "--json", str(tmp / f"{nb.stem}.json")]
    return {k: v for k, v in jobs.items() if section_of(k) not in skip}


def section_of(job: str) -> str:
    return "notebooks" if job.startswith("notebook ") else job


def side_by_side(tmp: Path, gpus: int, skip=()) -> dict:
    """Start every job at once; wait for each to its budget; the notebooks' per-cell records read back."""
    sections, lacking = {}, {}
    for section in ("notebooks", "gpu_tests", "device_guard"):
        lacking[section] = missing(EXTRAS[section])
    jobs = {}
    for name, cmd in side_by_side_jobs(tmp, gpus, skip).items():
        section = section_of(name)
        if lacking.get(section):
            continue
        jobs[name] = start(cmd, env={"SIMLIB_QUICK": "1"} if section == "notebooks" else None)
    print(f"gpu_check: {len(jobs)} jobs side by side (budget {BUDGETS['side_by_side']} s) ...", flush=True)
    done = {name: finish(job, BUDGETS["side_by_side"]) for name, job in jobs.items()}
    for name in ("gpu_tests", "device_guard", "scaling"):
        if name in skip:
            sections[name] = {"status": "skipped", "why": "--skip"}
        elif lacking.get(name):
            sections[name] = {"status": "skipped", "why": f"missing {', '.join(lacking[name])}: "
                                                          f"{install_hint(lacking[name])}"}
        else:
            sections[name] = {k: v for k, v in done[name].items() if k != "output"}
    if "notebooks" in skip:
        sections["notebooks"] = {"status": "skipped", "why": "--skip"}
    elif lacking["notebooks"]:
        sections["notebooks"] = {"status": "skipped", "why": f"missing {', '.join(lacking['notebooks'])}: "
                                                             f"{install_hint(lacking['notebooks'])}"}
    else:
        sections["notebooks"] = notebook_section(tmp, {k: v for k, v in done.items() if k.startswith("notebook ")})
    return sections


def notebook_section(tmp: Path, done: dict) -> dict:
    records = {}
    for name, job in done.items():
        stem = name.split(" ", 1)[1]
        path = tmp / f"{stem}.json"
        if path.exists():
            records[stem] = json.loads(path.read_text())
        else:  # killed before it wrote its record
            records[stem] = {"status": "failed", "error": "no record: " + job["output_tail"][-1500:]}
    failed = sorted(k for k, r in records.items() if r.get("status") == "failed")
    incomplete = sorted(k for k, r in records.items() if r.get("status") == "incomplete")
    return {"status": "failed" if failed else "incomplete" if incomplete else "passed", "failed": failed,
            "incomplete": incomplete, "notebooks": records}


def torchrun_section(gpus: int, tmp: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus), "-m", "simlib", "train",
           "gpt", "--quick", "--backend", "nccl", "--budget.seconds", "15", "--out", str(tmp / "torchrun")]
    record = run(cmd, BUDGETS["torchrun"])
    record["nproc_per_node"] = gpus
    return record


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git clone)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--skip", nargs="*", default=[], help="sections to leave out: calibration projects "
                        "torchrun notebooks gpu_tests device_guard scaling")
    parser.add_argument("--dry", action="store_true", help="print the plan and the missing packages; run nothing")
    args = parser.parse_args(argv)

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    print(f"gpu_check: {gpus} GPU(s); at most {planned_seconds()} s by design (budget {TOTAL_BUDGET} s)")
    for section, modules in EXTRAS.items():
        lacking = missing(modules)
        if lacking:
            print(f"gpu_check: {section} needs {', '.join(lacking)}: {install_hint(lacking)} "
                  "(the other sections run without it)")
    if args.dry:
        for name in PROJECTS:
            print(f"  project {name}: " + "  then  ".join(" ".join(c) for c in project_commands(name, "OUT").values()))
        for name, cmd in side_by_side_jobs(tmp, gpus, args.skip).items():
            print(f"  side by side, {name}: {' '.join(cmd)}")
        return 0
    from report import machine, write

    load_before = os.getloadavg()
    result = {"benchmark": "gpu_check", "commit": commit(), "cuda": gpus > 0, "gpus": gpus,
              "budget_seconds": TOTAL_BUDGET, "planned_seconds": planned_seconds(), "sections": {}}
    t0 = time.monotonic()
    if not gpus:
        print("gpu_check: no CUDA GPU here; every section skipped (run this on a machine with a GPU)")
        for name in ("calibration", "projects", "torchrun", "notebooks", "gpu_tests", "device_guard", "scaling"):
            result["sections"][name] = {"status": "skipped", "why": "no CUDA GPU"}
    else:
        skip = set(args.skip)
        sections = result["sections"]
        sections["calibration"] = calibration() if "calibration" not in skip else {"status": "skipped"}
        sections["projects"] = projects_section(tmp) if "projects" not in skip else {"status": "skipped"}
        sections["torchrun"] = torchrun_section(gpus, tmp) if "torchrun" not in skip else {"status": "skipped"}
        sections.update(side_by_side(tmp, gpus, skip))
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["machine"] = machine(load_before, gpus=gpus)
    out = write(json.loads(json.dumps(result, default=str)), args.out)
    print(json.dumps({k: v["status"] for k, v in result["sections"].items()}))
    print(f"wrote {out} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
