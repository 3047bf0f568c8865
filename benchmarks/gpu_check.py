"""The GPU check: run what the course promises on a machine with NVIDIA GPUs, in 9 minutes, and write one JSON.

    python benchmarks/gpu_check.py                 # no arguments: every section, results/gpu_check.json
    python benchmarks/gpu_check.py --dry           # print the plan (sections, commands, budgets); run nothing
    python benchmarks/gpu_check.py --skip notebooks --out /tmp/check.json

**Fits 9 minutes by design** (one command of a lent GPU machine, which allows 10). Every section has a time budget
(:func:`budgets`) with at least 30 % over the work measured or estimated for it, and is killed at it (SIGTERM,
then SIGKILL), recorded as failed with the tail of its output; one broken part never hides the others. First, alone
on the GPU (these are measurements): ``calibration`` (GEMM TFLOP/s by shape and dtype, HBM bandwidth, beside the
simulator's preset of the part it runs on: ``benchmarks/gpu_calibration.py``), ``projects`` (each project at its
GPU size for a fixed training time: step time, throughput, MFU against the datasheet's dense peak, the simulator's
prediction beside it: ``benchmarks/gpu_projects.py``), ``reference`` (the same GPT in a plain torch loop with
torch.compile and fused AdamW, its MFU by the course's code: ``benchmarks/gpu_reference.py``), ``torchrun``
(``torchrun --nproc-per-node <GPUs>`` with NCCL on every GPU). Then, side by side: the notebooks that reach a GPU
(lesson 05b's GPU cells among them), tests/test_gpu.py, the device guard and ``simlib scaling``
(``benchmarks/gpu_side_by_side.py``).

**From a fresh clone.** It needs torch and the course's own dependencies; what the dev extras add is checked
first: a section that lacks one is recorded as skipped with the ``pip install`` line that fixes it, and the others
run. **Without a GPU** it says so and runs nothing, and it never replaces a JSON that records a real GPU run: it
writes ``<out>.no_gpu.json`` beside it instead (:func:`output_path`). ``tests/test_gpu_check.py`` tests the pieces
on the CPU; ``bash tests/gpu_check.sh`` is the command for a lent machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import gpu_calibration  # noqa: E402
import gpu_projects  # noqa: E402
import gpu_side_by_side  # noqa: E402
from gpu_jobs import commit, install_hint, missing, run  # noqa: E402

TOTAL_BUDGET = 540  # seconds: the whole check, on one GPU (a lent machine's command may run 600)
MARGIN = gpu_projects.MARGIN  # every budget is at least this much over its section's work
# the work each section outside the projects needs, in seconds (measured on the H200 on 2026-12-04, or estimated
# and said so): the reference's start-up and compile (~45 s estimated from the GPT's) plus its training; torchrun's
# start-up and 15 s of training
REFERENCE_SECONDS = 20
WORK = {"calibration": 12, "reference": 10 + 45 + REFERENCE_SECONDS, "torchrun": 10 + 15 + 5}
SECTIONS = ("calibration", "projects", "reference", "torchrun", "notebooks", "gpu_tests", "device_guard", "scaling")


def budgets() -> dict:
    """Each section's budget in seconds: its work x :data:`MARGIN` (calibration, reference, torchrun), the
    projects' own (``gpu_projects.BUDGETS``) and the side-by-side phase's."""
    out = {name: round(work * MARGIN + 0.5) for name, work in WORK.items()}
    out["calibration"] = max(out["calibration"], gpu_calibration.BUDGET)
    out["projects"] = sum(gpu_projects.BUDGETS.values())
    out["side_by_side"] = gpu_side_by_side.BUDGET
    return out


def planned_seconds() -> int:
    """The longest the check can take: the sum of its budgets (what :data:`TOTAL_BUDGET` bounds)."""
    return sum(budgets().values())


def output_path(requested, gpus: int) -> Path:
    """Where this run writes: ``requested``, unless this machine has no GPU and ``requested`` holds a real GPU run
    (``"cuda": true``): then ``<requested stem>.no_gpu.json`` beside it, so a CPU run never replaces a measurement."""
    path = Path(requested)
    if gpus or not path.exists():
        return path
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return path
    return path.with_name(path.stem + ".no_gpu.json") if earlier.get("cuda") else path


def reference_section(tmp: Path) -> dict:
    out = tmp / "reference.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_reference.py"),
        "--seconds",
        str(REFERENCE_SECONDS),
        "--json",
        str(out),
    ]
    record = run(cmd, budgets()["reference"])
    if out.exists():
        record["result"] = json.loads(out.read_text())
    return record


def mfu_side_by_side(sections: dict) -> dict:
    """The course's MFU (``simlib train gpt --size gpu``) beside the plain torch loop's, both by the course's MFU
    code against the datasheet's dense peak."""
    gpt = (sections.get("projects", {}).get("projects") or {}).get("gpt") or {}
    ref = sections.get("reference", {}).get("result") or {}
    out = {
        "course_mfu": gpt.get("mfu"),
        "reference_mfu": ref.get("mfu"),
        "goal": 0.40,
        "course_tokens_per_s": gpt.get("tokens_per_s"),
        "reference_tokens_per_s": ref.get("tokens_per_s"),
        "peak": gpt.get("mfu_peak") or ref.get("peak_source"),
    }
    if out["course_mfu"] and out["reference_mfu"]:
        out["course_over_reference"] = out["course_mfu"] / out["reference_mfu"]
    return out


def torchrun_section(gpus: int, tmp: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(gpus),
        "-m",
        "simlib",
        "train",
        "gpt",
        "--quick",
        "--backend",
        "nccl",
        "--budget.seconds",
        "15",
        "--out",
        str(tmp / "torchrun"),
    ]
    record = run(cmd, budgets()["torchrun"])
    record["nproc_per_node"] = gpus
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--skip", nargs="*", default=[], help="sections to leave out: " + " ".join(SECTIONS))
    parser.add_argument("--all-notebooks", action="store_true", help="every lesson notebook, not only the GPU ones")
    parser.add_argument("--dry", action="store_true", help="print the plan and the missing packages; run nothing")
    args = parser.parse_args(argv)

    import torch

    from simlib.debug.mfu import preset_for

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name = torch.cuda.get_device_name(0) if gpus else "no GPU"
    hardware, note = preset_for(name) if gpus else ("h200", "")
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    print(
        f"gpu_check: {gpus} GPU(s) ({name}); the simulator predicts on preset {hardware!r}{'; ' + note if note else ''}; "
        f"at most {planned_seconds()} s by design (budget {TOTAL_BUDGET} s)"
    )
    extras = {**gpu_side_by_side.EXTRAS, "projects": gpu_projects.EXTRAS}
    for section, modules in extras.items():
        lacking = missing(modules)
        if lacking:
            print(
                f"gpu_check: {section} needs {', '.join(lacking)}: {install_hint(lacking)} "
                "(the other sections run without it)"
            )
    if args.dry:
        print(f"  budgets (s): {budgets()}")
        for project in gpu_projects.PROJECTS:
            cmds = gpu_projects.project_commands(project, "OUT", hardware=hardware)
            print(f"  project {project}: " + "  then  ".join(" ".join(c) for c in cmds.values()))
        for job, cmd in gpu_side_by_side.jobs(tmp, args.skip, every=args.all_notebooks).items():
            print(f"  side by side, {job}: {' '.join(cmd)}")
        return 0
    from report import machine, write

    load_before = os.getloadavg()
    result = {
        "benchmark": "gpu_check",
        "commit": commit(),
        "cuda": gpus > 0,
        "gpus": gpus,
        "device_name": name,
        "preset": hardware,
        "budget_seconds": TOTAL_BUDGET,
        "planned_seconds": planned_seconds(),
        "budgets": budgets(),
        "sections": {},
    }
    t0 = time.monotonic()
    sections = result["sections"]
    target = output_path(args.out, gpus)

    def save():  # after every section: a check stopped from outside keeps what it measured
        result["seconds"] = round(time.monotonic() - t0, 1)
        write(json.loads(json.dumps(result, default=str)), target)

    if not gpus:
        print("gpu_check: no CUDA GPU here; every section skipped (run this on a machine with a GPU)")
        for section in SECTIONS:
            sections[section] = {"status": "skipped", "why": "no CUDA GPU"}
    else:
        skip = set(args.skip)
        sections["calibration"] = gpu_calibration.calibration() if "calibration" not in skip else {"status": "skipped"}
        save()
        sections["projects"] = (
            gpu_projects.projects_section(tmp, hardware=hardware) if "projects" not in skip else {"status": "skipped"}
        )
        save()
        sections["reference"] = reference_section(tmp) if "reference" not in skip else {"status": "skipped"}
        result["mfu"] = mfu_side_by_side(sections)
        save()
        sections["torchrun"] = torchrun_section(gpus, tmp) if "torchrun" not in skip else {"status": "skipped"}
        save()
        sections.update(gpu_side_by_side.side_by_side(tmp, skip, every=args.all_notebooks))
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["machine"] = machine(load_before, gpus=gpus)
    if str(target) != str(args.out):
        print(f"gpu_check: {args.out} records a real GPU run: not replaced; this run goes to {target}")
    out = write(json.loads(json.dumps(result, default=str)), target)
    print(json.dumps({k: v["status"] for k, v in sections.items()}))
    if "mfu" in result:
        print(f"MFU: {json.dumps(result['mfu'], default=str)}")
    print(f"wrote {out} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
