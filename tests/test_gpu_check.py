"""The GPU check's pieces, on the CPU (benchmarks/gpu_check.py and the modules beside it): so that the next real
GPU run succeeds in one try. What needs a GPU itself is in tests/test_gpu.py; here: every budget has 30 % over its
section's work and they add up to less than a lent machine's 10-minute command; a notebook's every cell is
recorded; a command is killed at its budget; missing dev extras are named with their pip line while the other
sections still run; a project's row pairs the measured step with the simulator's prediction on the preset of the
part it runs on, and survives its run being killed; the GPT row's real command runs (evaluation off); the torch
reference runs; a run without a GPU never replaces a committed GPU run.
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_calibration  # noqa: E402
import gpu_check  # noqa: E402
import gpu_jobs  # noqa: E402
import gpu_notebooks  # noqa: E402
import gpu_projects  # noqa: E402
import gpu_reference  # noqa: E402
import gpu_side_by_side  # noqa: E402


def test_every_budget_has_30_percent_over_its_work_and_the_whole_fits_one_command():
    """Issue 50 (6): budgets with margin >= 30 %; the sum under TOTAL_BUDGET, itself under the 600 s a lent
    machine's command may run (with room for nvidia-smi, doctor and installing wheels)."""
    budgets = gpu_check.budgets()
    for name, work in gpu_check.WORK.items():
        assert budgets[name] >= 1.3 * work, (name, budgets[name], work)
    for name, extra in gpu_projects.WORK_BESIDES_TRAINING.items():
        assert gpu_projects.BUDGETS[name] >= 1.3 * (gpu_projects.TRAIN_SECONDS + extra), name
    assert gpu_check.planned_seconds() <= gpu_check.TOTAL_BUDGET <= 540
    assert set(gpu_side_by_side.GPU_NOTEBOOKS) <= {nb.stem for nb in gpu_side_by_side.notebooks(every=True)}
    assert "05b_one_device_step" in gpu_side_by_side.GPU_NOTEBOOKS  # the lesson's GPU cells run on the next GPU


def test_a_notebook_is_recorded_cell_by_cell_within_its_budget(tmp_path):
    """~15 s: one kernel start. A planted failure keeps its traceback; the next cells still run; the budget
    stops the notebook inside the slow cell and the cells after it are 'not_run'."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# planted"),
        nbformat.v4.new_code_cell("import os\nx = os.environ['SIMLIB_QUICK']"),
        nbformat.v4.new_code_cell("raise ValueError('planted failure')"),
        nbformat.v4.new_code_cell("assert x == '1'"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(120)"),
        nbformat.v4.new_code_cell("y = 2"),
    ]
    path = tmp_path / "planted.ipynb"
    nbformat.write(nb, str(path))
    out = tmp_path / "record.json"
    assert gpu_notebooks.main([str(path), "--budget", "20", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    cells = record["cells"]
    assert [c["status"] for c in cells] == ["passed", "failed", "passed", "timeout", "not_run"], cells
    assert [c["cell"] for c in cells] == [0, 1, 2, 3, 4] and cells[1]["index"] == 2  # nbval's numbering
    assert "ValueError: planted failure" in cells[1]["error"] and "planted failure" in cells[1]["traceback"]
    assert record["status"] == "failed" and record["failed"] == 1 and record["timeout"] == 1
    assert record["seconds"] < 60


def test_a_command_is_killed_at_its_budget():
    record = gpu_jobs.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 2)
    assert record["status"] == "failed" and "killed at its budget of 2 s" in record["output_tail"]
    assert "started" in record["output_tail"] and record["seconds"] < 15


def test_missing_extras_are_named_and_the_rest_still_runs(monkeypatch, tmp_path):
    """A fresh clone without the dev extras: the notebooks and pytest sections say what to pip install; scaling
    (which needs none of them) is still started."""
    started = []
    monkeypatch.setattr(
        gpu_side_by_side, "missing", lambda modules: [m for m in modules if m in ("nbclient", "pytest")]
    )
    monkeypatch.setattr(gpu_side_by_side, "start", lambda cmd, env=None: started.append(cmd) or {"cmd": cmd})
    monkeypatch.setattr(
        gpu_side_by_side,
        "finish",
        lambda job, budget: {"status": "passed", "output_tail": "", "output": "", "seconds": 1.0},
    )
    sections = gpu_side_by_side.side_by_side(tmp_path)
    assert sections["notebooks"]["status"] == "skipped" and "pip install nbclient" in sections["notebooks"]["why"]
    assert sections["gpu_tests"]["status"] == "skipped" and "pip install pytest" in sections["gpu_tests"]["why"]
    assert sections["scaling"]["status"] == "passed"
    assert [c[2:4] for c in started] == [["simlib", "scaling"]]
    assert gpu_jobs.install_hint(["sklearn", "arch"]) == "pip install scikit-learn arch"


def test_a_projects_row_pairs_the_measured_step_with_the_prediction(tmp_path):
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "device": "cuda:0",
                "step_time": 0.050,
                "tokens_per_s": 1e6,
                "mfu": 0.31,
                "mfu_peak_source": "datasheet",
                "mfu_peak": "datasheet: NVIDIA H200 dense bf16 989.4 TFLOP/s",
            }
        )
    )
    train = {"status": "passed", "seconds": 40.0, "command": "simlib train gpt --size gpu", "output": "ok"}
    predict = {
        "status": "passed",
        "command": "simlib train gpt --size gpu --dry-run --hardware h200",
        "output": "  predicted step on DGX H200: 40.5 ms (compute 38, exposed comm 0, bubble 0, optimizer 2)",
    }
    row = gpu_projects.read_project("gpt", train, predict, tmp_path)
    assert row["mfu"] == 0.31 and row["mfu_peak_source"] == "datasheet"
    assert row["prediction"]["hardware"] == "DGX H200" and row["prediction"]["step_time"] == pytest.approx(0.0405)
    assert row["prediction"]["measured_over_predicted"] == pytest.approx(0.050 / 0.0405)
    tiny = gpu_projects.read_project(
        "finance", train, {**predict, "output": "predicted step on DGX H200: 1.2e-05 ms ("}, tmp_path / "none"
    )
    assert tiny["prediction"]["step_time"] == pytest.approx(1.2e-8)
    old = {
        "status": "failed",
        "seconds": 2.0,
        "command": "x",
        "output": "simlib: error: unrecognized arguments: --size gpu",
    }
    row = gpu_projects.read_project("gpt", old, {"status": "failed", "command": "y", "output": ""}, tmp_path / "none")
    assert row["status"] == "skipped" and "--size gpu" in row["error"] and "update the clone" in row["error"]


def test_a_killed_run_still_leaves_its_summary(tmp_path):
    """Issue 50 (6): killed at its budget before train() wrote summary.json, the row reads the logged steps back
    (and writes summary.json, marked partial); the half-written last line is skipped."""
    rows = [
        {"step": s, "loss": 3.0, "samples": 64 * (s + 1), "tokens": 65536 * (s + 1), "train_time": 2.0 + 0.25 * s}
        for s in range(0, 60, 10)
    ]
    (tmp_path / "run.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 60, "lo')
    killed = {"status": "failed", "seconds": 104, "command": "simlib train gpt", "output": "killed at its budget"}
    row = gpu_projects.read_project("gpt", killed, {"status": "passed", "command": "p", "output": ""}, tmp_path)
    assert row["step_time"] == pytest.approx(0.25) and row["tokens_per_s"] == pytest.approx(65536 / 0.25)
    assert "killed" in row["partial"] and json.loads((tmp_path / "summary.json").read_text())["partial"]


def test_the_gpt_rows_own_command_runs_with_evaluation_off(tmp_path):
    """Issue 50 (1): the check's GPT command (``--budget.eval-every 0``) at the quick size on this CPU: the run
    passes and its loss plot is drawn (today's code raised KeyError: 'tokens' there). ~30 s."""
    out = tmp_path / "gpt"
    cmds = gpu_projects.project_commands("gpt", str(out), size="quick", seconds=2)
    assert cmds["train"][cmds["train"].index("--budget.eval-every") + 1] == "0"
    record = gpu_jobs.run(cmds["train"], 300, env={"SIMLIB_QUICK": "1"})
    assert record["status"] == "passed", record["output_tail"]
    assert (out / "loss.png").exists() and json.loads((out / "summary.json").read_text())["final_eval"] is None


def test_the_datasheet_tells_the_parts_apart_and_the_check_predicts_on_each_ones_preset():
    """Issue 50 (4): dense bf16 peaks by the name torch reports (NVIDIA's datasheets, sparse figures halved)."""
    from simlib.debug.mfu import datasheet_peak, preset_for

    parts = {
        "NVIDIA H100 80GB HBM3": (989.4e12, "h100"),
        "NVIDIA H100 PCIe": (756e12, "h100-pcie"),
        "NVIDIA H100 NVL": (835.5e12, "h100-nvl"),
        "NVIDIA H200": (989.4e12, "h200"),
        "NVIDIA H200 NVL": (835.5e12, "h100-nvl"),
        "NVIDIA B200": (2.25e15, "b200"),
        "NVIDIA B300 SXM6 AC": (2.25e15, "b300"),
        "NVIDIA GB200": (2.5e15, "gb200"),
    }
    for name, (peak, preset) in parts.items():
        assert datasheet_peak(name, "bf16") == peak, name
        assert preset_for(name)[0] == preset, name
        cmds = gpu_projects.project_commands("gpt", "/o", hardware=preset_for(name)[0])
        assert cmds["predict"][-2:] == ["--hardware", preset]
    assert "H200 NVL" in preset_for("NVIDIA H200 NVL")[1]  # the nearest preset, said so
    assert datasheet_peak("NVIDIA A10", "bf16") == 125e12 and datasheet_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert datasheet_peak("NVIDIA L4") == 121e12 and datasheet_peak("NVIDIA L40S") == 362e12


def test_the_calibration_code_runs_on_the_cpu_and_compares_with_the_parts_preset(monkeypatch):
    """The calibration section's own code at small sizes on this CPU (host clock), its comparison read as an
    H100's: the preset is the H100's, every shape priced by FLOPs and by shape, the shape model refitted."""
    rates = gpu_calibration.device_rates("cpu", shapes=[(64, 64, 64), (128, 64, 32)], hbm_elements=1 << 16)
    assert len(rates["gemms"]) == 4 and rates["hbm_bytes_per_s"] > 0
    rates.update(device_name="NVIDIA H100 80GB HBM3", multiprocessors=132)
    vs = gpu_calibration.compare_with_presets(rates)
    assert vs["preset_key"] == "h100" and vs["preset"].startswith("DGX H100")
    assert vs["datasheet_bf16_tflops"] == pytest.approx(989.4) and vs["gemm_shape_fit"]["sms"] == 132
    assert all(r["preset_by_shape_tflops"] > 0 for r in vs["gemms"])


def test_the_torch_reference_runs_on_the_cpu(tmp_path):
    """The reference's script, eager at a tiny size (its compiled path: tests/test_gpu_sizes.py)."""
    out = tmp_path / "ref.json"
    assert (
        gpu_reference.main(["--device", "cpu", "--tiny", "--seconds", "0.5", "--no-compile", "--json", str(out)]) == 0
    )
    ref = json.loads(out.read_text())
    assert ref["status"] == "passed" and 0 < ref["mfu"] < 1 and ref["fused_adamw"] and ref["steps"] >= 3
    course = {
        "projects": {"projects": {"gpt": {"mfu": 0.3, "tokens_per_s": 2.0, "mfu_peak": "datasheet"}}},
        "reference": {"result": ref},
    }
    both = gpu_check.mfu_side_by_side(course)
    assert both["course_over_reference"] == pytest.approx(0.3 / ref["mfu"]) and both["goal"] == 0.40


def test_the_commands_a_gpu_run_will_use():
    cmds = gpu_projects.project_commands("vision", "/o", py="python")
    assert cmds["train"][:9] == ["python", "-m", "simlib", "train", "vision", "--size", "gpu", "--world-size", "1"]
    assert "--dry-run" in cmds["predict"] and cmds["predict"][-1] == "h200"
    jobs = gpu_side_by_side.jobs(Path("/t"), skip=("gpu_tests",), py="python")
    assert "gpu_tests" not in jobs and "notebook 12_project_finance" in jobs and "notebook 05b_one_device_step" in jobs
    assert len([j for j in jobs if j.startswith("notebook ")]) == len(gpu_side_by_side.GPU_NOTEBOOKS)
    every = gpu_side_by_side.jobs(Path("/t"), every=True)
    assert len([j for j in every if j.startswith("notebook ")]) == len(gpu_side_by_side.notebooks(every=True))


def test_without_a_gpu_nothing_runs_and_a_committed_gpu_run_is_never_replaced(tmp_path, capsys):
    """Issue 50 (2): the committed H200 JSON stays as it is; the CPU run's JSON goes beside it."""
    out = tmp_path / "gpu_check.json"
    real = {"benchmark": "gpu_check", "cuda": True, "gpus": 1, "sections": {"calibration": {"status": "passed"}}}
    out.write_text(json.dumps(real))
    assert gpu_check.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == real
    beside = json.loads((tmp_path / "gpu_check.no_gpu.json").read_text())
    assert not beside["cuda"] and {s["status"] for s in beside["sections"].values()} == {"skipped"}
    assert "not replaced" in capsys.readouterr().out
    fresh = tmp_path / "fresh.json"
    assert gpu_check.main(["--out", str(fresh)]) == 0 and not json.loads(fresh.read_text())["cuda"]
    assert gpu_check.main(["--dry"]) == 0 and "project finance" in capsys.readouterr().out


def test_with_a_gpu_every_section_is_wired_and_saved_as_it_ends(tmp_path, monkeypatch):
    """The GPU branch of main() on this CPU, its sections replaced by stand-ins that record the JSON as it stood
    when each ran: the part's preset reaches the projects, the MFU pair is read, the file grows section by section."""
    import torch

    seen = {}
    out = tmp_path / "gpu_check.json"

    def stand_in(name, value):
        def section(*args, **kwargs):
            seen[name] = json.loads(out.read_text())["sections"] if out.exists() else {}
            seen[name + " args"] = (args, kwargs)
            return value

        return section

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(gpu_calibration, "calibration", stand_in("calibration", {"status": "passed"}))
    gpt = {"status": "passed", "mfu": 0.42, "tokens_per_s": 1.5e5, "mfu_peak": "datasheet"}
    projects = {"status": "passed", "projects": {"gpt": gpt}}
    monkeypatch.setattr(gpu_projects, "projects_section", stand_in("projects", projects))
    reference = {"status": "passed", "result": {"mfu": 0.5, "tokens_per_s": 1.8e5}}
    monkeypatch.setattr(gpu_check, "reference_section", stand_in("reference", reference))
    monkeypatch.setattr(gpu_check, "torchrun_section", stand_in("torchrun", {"status": "passed"}))
    monkeypatch.setattr(gpu_side_by_side, "side_by_side", stand_in("side", {"notebooks": {"status": "passed"}}))
    assert gpu_check.main(["--out", str(out)]) == 0
    assert seen["projects"] == {"calibration": {"status": "passed"}} and "projects" in seen["reference"]
    assert seen["projects args"][1]["hardware"] == "h100"
    result = json.loads(out.read_text())
    assert result["cuda"] and result["preset"] == "h100" and result["device_name"] == "NVIDIA H100 80GB HBM3"
    assert result["mfu"]["course_over_reference"] == pytest.approx(0.84)
    assert {s["status"] for s in result["sections"].values()} == {"passed"}


def test_the_lessons_profile_sorts_gpu_kernel_names_too():
    """Lesson 05b's profile on a GPU reads kernel names (cuBLAS, FlashAttention, inductor's Triton, AdamW's
    multi-tensor kernels); the same categories as the CPU's operators."""
    from simlib.lessons.one_device import categorize

    kernels = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "GEMM",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN": "GEMM",
        "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8": "GEMM",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>": "attention",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention",
        "triton_per_fused_add_native_layer_norm_0": "element-wise",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": "element-wise",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "aten::mm": "GEMM",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "Optimizer.step#AdamW.step": "optimizer",
        "aten::gelu": "element-wise",
    }
    assert {name: categorize(name) for name in kernels} == kernels
