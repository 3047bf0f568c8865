"""Honest MFU (simlib.debug.mfu): the GPT's FLOPs formula against torch's FLOP counter; MFU <= 1 for every plan."""

from simlib.debug import mfu
from simlib.projects.gpt.task import GPTTask


def test_flops_formula_matches_torch_flop_counter():
    task = GPTTask.quick(num_layers=3, hidden=96, num_heads=3)  # odd sizes: no term can match by accident
    counted = mfu.count(task)
    formula = counted["formula"]
    assert counted["mm"] == formula["weights"]  # every weight matmul, 6 per weight
    assert counted["attention"] == 2 * formula["attention"]  # full T x T counted; causal model FLOPs half
    assert counted["total"] == counted["formula_full"]["total"]  # nothing else is a matmul
    # the run record's formula (6 per parameter) errs high by the biases and LayerNorm only: under 1.5 %
    record = task.config.flops_per_token()
    assert formula["total"] < record < 1.015 * formula["total"]


def test_datasheet_table():
    assert mfu.datasheet_peak("NVIDIA H100 80GB HBM3 SXM", "bf16") == 989.4e12
    assert mfu.datasheet_peak("NVIDIA A100-SXM4-80GB", "fp32") == 19.5e12
    assert mfu.datasheet_peak("a laptop CPU") is None


def _mfu_of(plan_name):
    import torch.distributed as dist

    from simlib.projects.gpt import run as project_gpt
    from simlib.train import train

    cfg = {
        **project_gpt.settings(quick=True),
        "steps": 5,
        "eval_every": 0,
        "log_every": 10,
        "verbose": False,
        "measure_memory": False,
        "warmup": 2,
    }
    task = cfg.pop("task")
    plan = (
        project_gpt.plan_for(plan_name, dist.get_world_size())
        if plan_name in project_gpt.PLAN_NAMES
        else {
            "zero3": __import__("simlib.train", fromlist=["Plan"]).Plan(dp=2, zero_stage=3),
            "bf16": __import__("simlib.train", fromlist=["Plan"]).Plan(dp=2, mixed_precision="bf16"),
        }[plan_name]
    )
    s = train(task, plan, **cfg).summary
    return s["mfu"], s["mfu_peak"], s["mfu_flops"]


def test_mfu_at_most_one_for_every_plan(cluster2):
    for name in ("dp", "dp+acc", "tp", "pp", "zero3", "bf16"):
        value, peak, flops = cluster2.run(_mfu_of, name)[0]
        assert 0 < value <= 1, (name, value)
        assert peak.startswith("measured: the best of 5") and "flops_per_sample" in flops
        if name == "bf16":
            assert "fp32 and bf16" in peak


def test_datasheet_names_as_torch_reports_them():
    """torch names an H100 SXM "NVIDIA H100 80GB HBM3" (no "SXM"); "A10" must not match an A100, nor "L4" an L40S;
    a GPU without bf16 (T4, V100) has no bf16 peak, only fp16."""
    assert mfu.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert mfu.datasheet_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert mfu.datasheet_peak("NVIDIA H200", "bf16") == 989.4e12
    assert mfu.datasheet_peak("NVIDIA A100-SXM4-40GB", "bf16") == 312e12
    assert mfu.datasheet_peak("NVIDIA L40S", "bf16") == 362e12 and mfu.datasheet_peak("NVIDIA L4", "bf16") == 121e12
    assert mfu.datasheet_peak("NVIDIA A10G", "bf16") is None  # no NVIDIA figures: measured instead
    assert mfu.datasheet_peak("Tesla T4", "bf16") is None and mfu.datasheet_peak("Tesla T4", "fp16") == 65e12
    assert mfu.datasheet_peak("Tesla V100-PCIE-16GB", "fp16") == 112e12


def test_gpu_peak_is_the_datasheet_with_the_measured_large_gemm_beside_it(monkeypatch):
    """On a GPU, MFU divides by the dtype's datasheet peak (the H200 run's summary divided by a 512^3 matmul,
    11 TFLOP/s, and read 13.7 % for 0.1 %); an unknown GPU falls back to the measured large GEMM, and says so."""
    import torch

    measured = lambda device, dtype: 785e12  # noqa: E731 - what the H200 measured at 8192^3 in bf16
    p = mfu.device_peak("cuda:0", "bf16", name="NVIDIA H200", measure=measured)
    assert p["peak"] == 989.4e12 and p["source"] == "datasheet" and p["measured_large_gemm"] == 785e12
    assert "datasheet" in p["text"] and "989.4" in p["text"] and "785" in p["text"]
    # the H200 bf16 GPT run: 154,759 tokens/s x 5.74 MFLOP per token over this peak is about 0.1 %, not 13.7 %
    assert 0.0008 < 154_759 * 5.74e6 / p["peak"] < 0.0010
    unknown = mfu.device_peak("cuda:0", "fp16", name="NVIDIA A10G", measure=lambda d, t: 50e12)
    assert unknown["peak"] == 50e12 and unknown["source"] == "measured" and "no datasheet entry" in unknown["text"]
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert mfu.run_dtype(None) == "fp32"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert mfu.run_dtype(None) == "tf32" and mfu.run_dtype("bf16") == "bf16"


def test_summary_counts_each_gpu_once_and_says_which_peak(monkeypatch):
    """build_summary on a (faked) GPU: two ranks sharing one GPU count its peak once; on the CPU the measured
    512^3 rate stays the peak, summed over ranks."""
    import types

    import torch

    from simlib import record
    from simlib.train import Plan

    monkeypatch.setattr(
        mfu,
        "device_peak",
        lambda device, mp: {
            "peak": 989.4e12,
            "source": "datasheet",
            "dtype": mp,
            "name": "NVIDIA H200",
            "measured_large_gemm": 700e12,
            "text": "datasheet: NVIDIA H200 dense bf16 989.4 TFLOP/s",
        },
    )
    task = types.SimpleNamespace(name="t", global_batch=10, flops_per_sample=1e12, tokens_per_sample=0)
    state = types.SimpleNamespace(step=5, samples=50, tokens=0, train_time=1.0)
    timeline = __import__("pandas").DataFrame()
    monkeypatch.setattr("simlib.timeline.summarize", lambda tl: {"step_time": 0.1, "step_time_iqr": 0.0})

    def summary(device, everyone_else=()):
        ctx = types.SimpleNamespace(device=torch.device(device), world_size=1 + len(everyone_else), backend="gloo")
        if everyone_else:  # the other ranks' reports, as all_gather_object would bring them
            monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
            monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1 + len(everyone_else))
            monkeypatch.setattr(
                torch.distributed,
                "all_gather_object",
                lambda out, mine: out.__setitem__(slice(None), [mine, *everyone_else]),
            )
        return record.build_summary(
            task, Plan(mixed_precision="bf16"), ctx, state, timeline, [], [], None, None, 2e9, 1.0
        )

    gpu = summary("cuda:0")
    assert gpu["mfu_peak_source"] == "datasheet" and gpu["mfu_peak_flops"] == 989.4e12
    assert abs(gpu["mfu"] - 1e13 / 0.1 / 989.4e12) < 1e-12 and gpu["large_gemm_tflops_per_gpu"] == [700.0]
    cpu = summary("cpu")
    assert cpu["mfu_peak"].startswith("measured: the best of 5") and cpu["mfu_peak_flops"] == 2e9
    other = [
        None,
        2e9,
        {
            "peak": 989.4e12,
            "source": "datasheet",
            "measured_large_gemm": 700e12,
            "text": "",
            "where": [__import__("socket").gethostname(), "cuda:0"],
        },
    ]
    shared = summary("cuda:0", [other])
    assert shared["mfu_peak_flops"] == 989.4e12  # two ranks, one GPU: its peak once
