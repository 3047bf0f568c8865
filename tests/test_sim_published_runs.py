"""The simulator on today's runs: Llama-style models, fused attention, FSDP, the broad validation set.

Pure arithmetic (no processes): a few seconds in all."""

import collections
import dataclasses

import pytest

from simlib import sim
from simlib.sim import layer, layer_strategy, memory, runs
from simlib.sim.cost import gpt_stage
from simlib.sim.grad_sync import fsdp_comm


@pytest.fixture(scope="module")
def table():
    return runs.validation_table()


def test_validation_set_is_broad_sourced_and_split_by_a_fixed_rule(table):
    rows = runs.load_rows()
    assert len(table) >= 100 and table.source.nunique() >= 4
    assert all(r["source_url"].startswith("https://github.com/") and r["table"] for r in rows)
    # every input stated: shapes, layout, batch, precision, attention, the measured number
    for key in (
        "layers",
        "hidden",
        "heads",
        "seq_len",
        "gpus",
        "micro_batch",
        "global_batch",
        "precision",
        "attention",
        "recompute",
        "sharding",
        "measured",
    ):
        assert all(r[key] not in ("", None) for r in rows), key
    # the split rule: within each source, in file order, even positions fit, odd test
    seen = collections.Counter()
    for r in rows:
        assert r["split"] == ("fit" if seen[r["source"]] % 2 == 0 else "test")
        seen[r["source"]] += 1


def test_held_out_half_within_ten_percent_and_every_run_that_ran_fits(table):
    ok = table[table.expressible]
    test = ok[ok.split == "test"]
    assert test.error.astype(float).abs().mean() <= 0.10
    assert ok.fits.astype(bool).all(), ok[~ok.fits.astype(bool)].id.tolist()
    # the Megatron-LM sets stay where they were (Narayanan Table 1 5.6 %, Korthikanti 3.8 % before this change)
    for source, limit in (("Narayanan 2021", 0.10), ("Korthikanti 2022", 0.10)):
        assert ok[ok.source == source].error.astype(float).abs().mean() <= limit
    # what cannot be stated is said, with its reason
    assert (table[~table.expressible].reason.str.len() > 10).all()


def test_llama_is_expressible_with_published_parameter_counts():
    assert sim.llama_size("llama3-8b").params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert sim.llama_size("llama2-70b").params / 1e9 == pytest.approx(68.98, abs=0.05)
    assert sim.llama_size("llama3-405b").params / 1e9 == pytest.approx(405.85, abs=0.05)
    m = sim.llama_size("llama3-8b")
    assert (m.kv, m.ffn, m.qkv_width, m.up_width) == (8, 14336, 4096 + 2 * 8 * 128, 2 * 14336)
    p = sim.predict(
        m,
        sim.dgx_h100(),
        sim.Strategy(dp=8, micro_batch=1, zero_stage=3, fsdp=True, attention="flash", recompute="full"),
    )
    assert p.fits and 0.2 < p.mfu < 0.8
    with pytest.raises(ValueError, match="kv_heads"):
        sim.transformer(2, 64, 8, kv_heads=3)


def test_flash_attention_flops_and_memory():
    m = sim.llama_size("llama2-7b", seq_len=4096)
    ops = layer.layer_ops(m, 1, attention="flash")
    fwd = next(o for o in ops["forward"] if o.kind == "attention")
    bwd = next(o for o in ops["backward"] if o.kind == "attention")
    s, d, heads = 4096, 128, 32
    assert fwd.flops == pytest.approx(2 * s * s * d * heads)  # causal: half of 4·s²·d per head
    assert bwd.flops == pytest.approx(2.5 * fwd.flops)  # Dao 2023: backward 2.5× forward
    assert not any(o.name.startswith("scores") for o in ops["forward"])
    unfused = memory.activation_bytes_per_layer(m, 1, attention="unfused")
    fused = memory.activation_bytes_per_layer(m, 1, attention="flash")
    # the s×s tensors vanish: Llama has no dropout, so of Korthikanti's 5·a·s²·b bytes (softmax output 2, dropout
    # mask 1, dropout output 2) only the softmax output's 2·a·s²·b were kept
    assert unfused - fused == pytest.approx(2 * heads * s * s)
    # Megatron's GPT (MHA, GeLU 4h, dropout) is still s·b·h·(34 + 5as/h)
    g = sim.gpt(4, 1024, 16, seq_len=512)
    assert memory.activation_bytes_per_layer(g, 2, attention="unfused", sequence_parallel=False) == pytest.approx(
        512 * 2 * 1024 * (34 + 5 * 16 * 512 / 1024)
    )


def test_torchtitan_op_recompute_redoes_every_second_gemm():
    m = sim.llama_size("llama3-8b")
    again = layer_strategy.recompute_ops(layer.layer_ops(m, 1, attention="flash")["forward"], "op", m)
    gemms = [o.name for o in again if o.kind == "gemm"]
    assert gemms == ["recompute K", "recompute attention out", "recompute MLP up"]  # mm 2, 4, 6 of Q K V O W1 W3 W2
    assert all(o.kind in ("gemm", "memory") for o in again)


def test_fsdp_overlap_hides_all_gathers_behind_layer_compute_and_exposes_the_rest():
    m = sim.llama_size("llama2-13b")
    hw = sim.dgx_a100()
    s = sim.Strategy(dp=8, micro_batch=2, zero_stage=3, fsdp=True, attention="flash", recompute="full")
    st = gpt_stage(m, hw, s)
    f = fsdp_comm(m, hw, s, st["layer_forward"], st["layer_backward"])
    # in one node each layer's gather is far shorter than its compute: only the first gather and last scatter show
    ends = (f["per_micro_batch"] - m.layers * (2 * f["gather_per_layer"] + f["scatter_per_layer"])) / 2
    assert f["gather_per_layer"] < st["layer_forward"]
    assert f["exposed_per_micro_batch"] == pytest.approx(f["gather_per_layer"] + f["scatter_per_layer"] + ends)
    slow = hw.with_(intra=sim.Link(1e-5, 1e9))  # a 1 GB/s link: communication dominates
    f_slow = fsdp_comm(m, slow, s, st["layer_forward"], st["layer_backward"])
    assert f_slow["exposed_per_micro_batch"] > 0.5 * f_slow["per_micro_batch"]
    # hybrid sharding: shard in the node, replicate across; it must divide dp
    sim.Strategy(dp=16, zero_stage=3, fsdp=True, shard_size=8)
    with pytest.raises(ValueError, match="shard_size"):
        sim.Strategy(dp=16, zero_stage=3, fsdp=True, shard_size=6)
    with pytest.raises(ValueError, match="fsdp"):
        sim.Strategy(dp=16, zero_stage=1, fsdp=True)


def test_h100_presets_and_fp8():
    today, era = sim.dgx_h100(), sim.dgx_h100("2023")
    assert today.gemm_rate(1000) / era.gemm_rate(1000) == pytest.approx(780 / 549.5)
    m = sim.transformer(32, 2560, 20, 2048, 50368, bias=False, dropout=False)
    s = sim.Strategy(dp=8, micro_batch=8, zero_stage=3, fsdp=True, attention="flash")
    bf16 = sim.predict(m, today, s).step_time
    fp8 = sim.predict(m, today, s.replace(dtype="fp8")).step_time
    assert 0.5 < fp8 / bf16 < 1.0  # GEMMs faster, casts and attention not
    with pytest.raises(ValueError, match="software"):
        sim.dgx_h100("2030")


def test_tp_comm_overlap_hides_collectives_behind_gemms():
    m = sim.gpt(8, 8192, 64, seq_len=2048)
    s = sim.Strategy(tp=8, micro_batch=1, sequence_parallel=True, recompute="selective")
    plain, overlapped = gpt_stage(m, sim.dgx_h100(), s), gpt_stage(m, sim.dgx_h100(), s.replace(tp_overlap=True))
    assert 0 <= overlapped["forward_comm"] < plain["forward_comm"]
    # partial: the first/last chunk of each collective (1/tp of it) stays exposed, and the GEMMs that share
    # their SMs with communication run slower (compute grows)
    assert overlapped["forward_comm"] >= plain["forward_comm"] / 8 * 0.999
    assert overlapped["forward"] > plain["forward"]
    gain = (plain["forward"] + plain["forward_comm"]) / (overlapped["forward"] + overlapped["forward_comm"]) - 1
    assert 0 < gain < 0.35  # torchtitan measured up to ~29 % on the forward pass (async TP post, 2024)
    with pytest.raises(ValueError, match="sequence_parallel"):
        sim.Strategy(tp=8, tp_overlap=True)


def test_memory_against_torchtitans_published_figures():
    """torchtitan's only memory figures for runs of the set (benchmarks/planner_experts_memory.py has the sources).
    A100 page: Llama 2 70B with selective-op checkpointing ran at local batch 1 and ran out of memory at 2 on
    80 GB. H100 benchmark (peak *reserved* GiB, an upper bound on what was needed): Llama 3.1 8B, FSDP, local batch
    2, 82.4 GiB on 8 GPUs and 67.0 on 128. The sharded states are the difference (same per-GPU batch): 15.4 GiB."""
    rows = {r["id"]: r for r in runs.load_rows()}
    r = rows["torchtitan-006"]
    model, s, hw = runs.model_of(r), runs.strategy_of(r), runs.HARDWARE[r["gpu"]]()
    assert sim.predict(model, hw, s).fits
    assert not sim.predict(model, hw, dataclasses.replace(s, micro_batch=2)).fits
    gib = {}
    for run_id, published in (("torchtitan-008", 82.4), ("torchtitan-015", 67.0)):
        r = rows[run_id]
        p = sim.predict(runs.model_of(r), sim.hardware_presets.dgx_h100(), runs.strategy_of(r))
        gib[run_id] = p.memory["total"] / 2**30
        assert gib[run_id] < published  # below the reserved peak (how far below, the published figure cannot say)
    assert abs((gib["torchtitan-008"] - gib["torchtitan-015"]) - (82.4 - 67.0)) < 2.0
