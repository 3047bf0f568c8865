"""What scale_runs reads from a row's columns: the Megatron settings (no source keyed), recomputation, the source's
own TFLOP/s formula, stated features it cannot price, MoE by the model's experts, and whole-MoE recomputation."""

import csv
import dataclasses

import pytest

from simlib import sim
from simlib.sim import runs, scale_runs
from simlib.sim.layer_strategy import module_recompute_ops, strategy_layer_ops
from simlib.sim.memory import memory_per_device


def _row(id_):
    return next(r for r in scale_runs.load_rows() if r["id"] == id_)


def test_settings_are_the_rows_columns_not_its_source():
    """The same columns give the same plan whatever the source is called; an empty cell is "off" for every source."""
    mb = _row("megatron-bridge-25.11-000")
    model = sim.llama_size(mb["model"], seq_len=mb["seq_len"])
    renamed = dict(mb, source="someone-else")
    assert scale_runs.strategy_of(renamed, model) == scale_runs.strategy_of(mb, model)
    nemo = next(r for r in scale_runs.load_rows() if r["source"] == "nemo-perf-summary" and r["tp"] > 1)
    s = scale_runs.strategy_of(nemo, sim.llama_size(nemo["model"], seq_len=nemo["seq_len"]))
    assert not (s.tp_overlap or s.param_gather_overlap or s.ep_overlap) and s.recompute == "none"
    on = dict(nemo, tp_overlap=True, param_gather_overlap=True)
    s_on = scale_runs.strategy_of(on, sim.llama_size(nemo["model"], seq_len=nemo["seq_len"]))
    assert s_on.tp_overlap and s_on.param_gather_overlap and "async_tp" in scale_runs.kinds_of(on)


def test_megatron_lm_counts_causal_attention_as_the_modelzoo_table_does():
    """The ModelZoo H100 table's 167 TFLOP/s at a 29.0 s step (1,129.9 tokens/s per GPU) implies 1.478e11 FLOPs a
    token for Qwen3-235B at 4,096: Megatron-LM's formula, half the s² term of ModelSpec.flops_per_token's."""
    m = sim.llama_size("qwen3-235b-a22b", seq_len=4096)
    assert scale_runs.megatron_lm_flops_per_token(m) == pytest.approx(167e12 / 1129.9, rel=0.005)
    assert m.flops_per_token() > 1.12 * scale_runs.megatron_lm_flops_per_token(m)
    row = _row("megatron-moe-modelzoo-005")  # a TFLOP/s row of that source, turned back with its formula
    assert row["flops_formula"] == "megatron-lm"
    assert scale_runs.measured_tokens(row, sim.llama_size(row["model"], seq_len=row["seq_len"])) == pytest.approx(
        row["measured"]
        * 1e12
        / scale_runs.megatron_lm_flops_per_token(sim.llama_size(row["model"], seq_len=row["seq_len"]))
    )
    with pytest.raises(ValueError, match="grouped-query"):
        scale_runs.megatron_lm_flops_per_token(sim.llama_size("deepseek-v3"))


def test_stated_features_and_models_decide_what_is_expressible(tmp_path):
    dropless = _row("megatron-moe-modelzoo-006")
    assert "dropless" in scale_runs.why_inexpressible(dropless)
    assert not scale_runs.why_inexpressible(_row("megatron-moe-modelzoo-005"))  # its forced-balance twin
    assert not scale_runs.why_inexpressible(_row("megatron-moe-modelzoo-013"))  # CUDA graphs: priced as no change
    assert "compile" in scale_runs.why_inexpressible(_row("nemo-automodel-004"))
    assert "has no shape" in scale_runs.why_inexpressible(dict(dropless, model="gpt4-secret", features=()))
    with open(scale_runs.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(dict(rows[0], features="warp_drive"))
    with pytest.raises(ValueError, match="warp_drive"):
        scale_runs.load_rows(bad)


def test_moe_is_recognised_by_the_models_experts():
    row = dict(_row("megatron-bridge-25.11-000"), model="mixtral-8x7b", ep=1)
    assert "moe" in scale_runs.kinds_of(row)
    assert "moe" not in scale_runs.kinds_of(dict(row, model="llama3-8b"))
    assert "h200" in runs.HARDWARE and runs.HARDWARE["h200"]().memory_bytes > runs.HARDWARE["h100_80gb"]().memory_bytes


def test_whole_moe_recompute_reruns_the_moe_layer_and_keeps_only_its_input():
    m = sim.llama_size("qwen3-30b-a3b")
    s = sim.Strategy(dp=8, ep=8, attention="flash", micro_batch=1, num_micro_batches=2, zero_stage=1)
    fwd = strategy_layer_ops(m, s, expert_layer=True)["forward"]
    again = {op.name for op in module_recompute_ops(fwd, ("moe",))}
    assert {"recompute router", "recompute dispatch all-to-all", "recompute combine all-to-all"} <= again
    assert not any("attention" in n or "QKV" in n or "RMSNorm" in n for n in again)
    kept = [
        memory_per_device(m, dataclasses.replace(s, recompute_modules=mods))["activations"]
        for mods in ((), ("moe_act",), ("moe",))
    ]
    assert kept[0] > kept[1] > kept[2]
    slower = [
        sim.predict(m, sim.dgx_h100(), dataclasses.replace(s, recompute_modules=x)).step_time for x in ((), ("moe",))
    ]
    assert slower[1] > slower[0]
