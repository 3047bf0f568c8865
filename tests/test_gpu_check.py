"""The GPU check's pieces, on the CPU (benchmarks/gpu_check.py, benchmarks/gpu_notebooks.py): so that the next
real GPU run succeeds in one try. What needs a GPU itself is in tests/test_gpu.py; here: the budgets add up to
8 minutes, a notebook's every cell is recorded (a failing cell's traceback kept, a budget that runs out stops the
notebook there), a command is killed at its budget, missing dev extras are named with their pip line while the
other sections still run, and a project's row pairs the measured step with the simulator's prediction.
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_notebooks  # noqa: E402


def test_the_whole_check_fits_eight_minutes_by_design():
    assert gpu_check.TOTAL_BUDGET == 480
    assert gpu_check.planned_seconds() <= gpu_check.TOTAL_BUDGET
    assert gpu_check.TRAIN_SECONDS < gpu_check.BUDGETS["project"]


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
    record = gpu_check.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 2)
    assert record["status"] == "failed" and "killed at its budget of 2 s" in record["output_tail"]
    assert "started" in record["output_tail"] and record["seconds"] < 15


def test_missing_extras_are_named_and_the_rest_still_runs(monkeypatch, tmp_path):
    """A fresh clone without the dev extras: the notebooks and pytest sections say what to pip install; scaling
    (which needs none of them) is still started."""
    started = []
    monkeypatch.setattr(gpu_check, "missing", lambda modules: [m for m in modules if m in ("nbclient", "pytest")])
    monkeypatch.setattr(gpu_check, "start", lambda cmd, env=None: started.append(cmd) or {"cmd": cmd})
    monkeypatch.setattr(
        gpu_check, "finish", lambda job, budget: {"status": "passed", "output_tail": "", "output": "", "seconds": 1.0}
    )
    sections = gpu_check.side_by_side(tmp_path, gpus=1)
    assert sections["notebooks"]["status"] == "skipped" and "pip install nbclient" in sections["notebooks"]["why"]
    assert sections["gpu_tests"]["status"] == "skipped" and "pip install pytest" in sections["gpu_tests"]["why"]
    assert sections["scaling"]["status"] == "passed"
    assert [c[2:4] for c in started] == [["simlib", "scaling"]]
    assert gpu_check.install_hint(["sklearn", "arch"]) == "pip install scikit-learn arch"


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
    row = gpu_check.read_project("gpt", train, predict, tmp_path)
    assert row["mfu"] == 0.31 and row["mfu_peak_source"] == "datasheet"
    assert row["prediction"]["hardware"] == "DGX H200" and row["prediction"]["step_time"] == pytest.approx(0.0405)
    assert row["prediction"]["measured_over_predicted"] == pytest.approx(0.050 / 0.0405)
    tiny = gpu_check.read_project(
        "finance", train, {**predict, "output": "predicted step on DGX H200: 1.2e-05 ms ("}, tmp_path / "none"
    )
    assert tiny["prediction"]["step_time"] == pytest.approx(1.2e-8)
    old = {
        "status": "failed",
        "seconds": 2.0,
        "command": "x",
        "output": "simlib: error: unrecognized arguments: --size gpu",
    }
    row = gpu_check.read_project("gpt", old, {"status": "failed", "command": "y", "output": ""}, tmp_path / "none")
    assert row["status"] == "skipped" and "--size gpu" in row["error"] and "update the clone" in row["error"]


def test_the_commands_a_gpu_run_will_use():
    cmds = gpu_check.project_commands("vision", "/o", py="python")
    assert cmds["train"][:9] == ["python", "-m", "simlib", "train", "vision", "--size", "gpu", "--world-size", "1"]
    assert "--dry-run" in cmds["predict"] and cmds["predict"][-1] == "h200"
    jobs = gpu_check.side_by_side_jobs(Path("/t"), 1, skip=("gpu_tests",), py="python")
    assert "gpu_tests" not in jobs and "notebook 12_project_finance" in jobs and "scaling" in jobs
    assert len([j for j in jobs if j.startswith("notebook ")]) == len(gpu_check.notebooks())


def test_without_a_gpu_every_section_is_skipped_and_the_json_says_so(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert not result["cuda"] and result["commit"] and result["planned_seconds"] <= 480
    assert {s["status"] for s in result["sections"].values()} == {"skipped"}
    assert gpu_check.main(["--dry"]) == 0 and "project finance" in capsys.readouterr().out
