"""Honest MFU (simlib.debug.mfu): the GPT's FLOPs formula against torch's FLOP counter; MFU <= 1 for every plan."""
from simlib.debug import mfu
from simlib.projects.gpt.task import GPTTask


def test_flops_formula_matches_torch_flop_counter():
    task = GPTTask.quick(num_layers=3, hidden=96, num_heads=3)  # odd sizes: no term can match by accident
    counted = mfu.count(task)
    formula = counted["formula"]
    assert counted["mm"] == formula["weights"]                        # every weight matmul, 6 per weight
    assert counted["attention"] == 2 * formula["attention"]           # full T x T counted; causal model FLOPs half
    assert counted["total"] == counted["formula_full"]["total"]        # nothing else is a matmul
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
    cfg = {**project_gpt.settings(quick=True), "steps": 5, "eval_every": 0, "log_every": 10, "verbose": False,
           "measure_memory": False, "warmup": 2}
    task = cfg.pop("task")
    plan = project_gpt.plan_for(plan_name, dist.get_world_size()) if plan_name in project_gpt.PLAN_NAMES else {
        "zero3": __import__("simlib.train", fromlist=["Plan"]).Plan(dp=2, zero_stage=3),
        "bf16": __import__("simlib.train", fromlist=["Plan"]).Plan(dp=2, mixed_precision="bf16")}[plan_name]
    s = train(task, plan, **cfg).summary
    return s["mfu"], s["mfu_peak"], s["mfu_flops"]


def test_mfu_at_most_one_for_every_plan(cluster2):
    for name in ("dp", "dp+acc", "tp", "pp", "zero3", "bf16"):
        value, peak, flops = cluster2.run(_mfu_of, name)[0]
        assert 0 < value <= 1, (name, value)
        assert peak.startswith("measured: the best of 5") and "flops_per_sample" in flops
        if name == "bf16":
            assert "fp32 and bf16" in peak
