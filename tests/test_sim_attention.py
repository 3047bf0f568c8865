"""Attention variants in the cost model (simlib.sim.attention): multi-head latent attention and the
multi-token-prediction module (DeepSeek-V3), alternating sliding windows and attention sinks (GPT-OSS). Parameters
against torch modules of the published shapes at a tiny size, FLOPs and activation bytes against hand counts."""

import pytest
import torch
from torch import nn

from simlib import sim
from simlib.sim import attention, memory
from simlib.sim.cost import gpt_stage
from simlib.sim.layer import layer_ops, mtp_ops
from simlib.sim.scale_runs import deepseek_v3_layout

# a DeepSeek-V3-shaped model at a tiny size: 4 layers (1 dense), MLA, 8 routed + 1 shared expert, one MTP module
DS = dict(
    layers=4,
    hidden=32,
    heads=4,
    kv_heads=4,
    ffn_hidden=48,
    vocab=100,
    seq_len=16,
    experts=8,
    top_k=2,
    expert_ffn=8,
    shared_experts=1,
    dense_layers=1,
    router_bias=True,
    q_lora=12,
    kv_lora=6,
    qk_nope=8,
    qk_rope=4,
    v_head=8,
    mtp_layers=1,
)
# a GPT-OSS-shaped model at a tiny size: biases, 8 experts with biases, every second layer windowed, sinks
OSS = dict(
    layers=4,
    hidden=24,
    heads=4,
    kv_heads=2,
    ffn_hidden=24,
    vocab=100,
    seq_len=32,
    experts=8,
    top_k=2,
    expert_ffn=24,
    head_dim=8,
    bias=True,
    expert_bias=True,
    router_bias=True,
    window=4,
    window_layers=2,
    sinks=True,
)


def _linear(i, o, bias=False):
    return nn.Linear(i, o, bias=bias)


def _swiglu(h, f, bias=False):
    return nn.ModuleList([_linear(h, f, bias), _linear(h, f, bias), _linear(f, h, bias)])


def _moe(h, c, bias):
    router = _linear(h, c["experts"], c.get("router_bias", False))
    experts = nn.ModuleList([_swiglu(h, c["expert_ffn"], bias) for _ in range(c["experts"])])
    shared = nn.ModuleList([_swiglu(h, c["expert_ffn"]) for _ in range(c.get("shared_experts", 0))])
    return nn.ModuleList([router, experts, shared])


def deepseek_like(c):
    """The parameters of DeepSeek-V3's modules (HF modeling_deepseek.py names) at the sizes of ``c``."""
    h, a = c["hidden"], c["heads"]
    dqk = c["qk_nope"] + c["qk_rope"]

    def block(moe):
        mla = nn.ModuleDict(
            dict(
                q_a_proj=_linear(h, c["q_lora"]),
                q_a_layernorm=nn.RMSNorm(c["q_lora"]),
                q_b_proj=_linear(c["q_lora"], a * dqk),
                kv_a_proj_with_mqa=_linear(h, c["kv_lora"] + c["qk_rope"]),
                kv_a_layernorm=nn.RMSNorm(c["kv_lora"]),
                kv_b_proj=_linear(c["kv_lora"], a * (c["qk_nope"] + c["v_head"])),
                o_proj=_linear(a * c["v_head"], h),
            )
        )
        mlp = _moe(h, c, False) if moe else _swiglu(h, c["ffn_hidden"])
        return nn.ModuleList([nn.RMSNorm(h), mla, nn.RMSNorm(h), mlp])

    layers = [block(i >= c["dense_layers"]) for i in range(c["layers"])]
    # MTP (report §2.2): RMSNorms of the hidden state and of the next token's embedding, M: 2h -> h, a block,
    # the norm before the shared head (HF's shared_head.norm); embedding and head are the main model's
    mtp = [
        nn.ModuleList([nn.RMSNorm(h), nn.RMSNorm(h), _linear(2 * h, h), block(True), nn.RMSNorm(h)])
        for _ in range(c["mtp_layers"])
    ]
    return nn.ModuleList([nn.Embedding(c["vocab"], h), *layers, nn.RMSNorm(h), _linear(h, c["vocab"]), *mtp])


def gpt_oss_like(c):
    """GPT-OSS's modules (HF modeling_gpt_oss.py) at the sizes of ``c``: biased Q, K, V, O, a sink per head."""
    h, a, kv, d = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]

    def block():
        attn = nn.ModuleList(
            [_linear(h, a * d, True), _linear(h, kv * d, True), _linear(h, kv * d, True), _linear(a * d, h, True)]
        )
        attn.sinks = nn.Parameter(torch.zeros(a))
        return nn.ModuleList([nn.RMSNorm(h), attn, nn.RMSNorm(h), _moe(h, c, True)])

    return nn.ModuleList(
        [nn.Embedding(c["vocab"], h), *[block() for _ in range(c["layers"])], nn.RMSNorm(h), _linear(h, c["vocab"])]
    )


def count(module):
    return sum(p.numel() for p in module.parameters())


# ── parameters ──
def test_mla_and_mtp_parameters_equal_the_modules_count():
    m = sim.llama(**DS)
    assert m.mla and m.params == count(deepseek_like(DS))
    no_mtp = sim.llama(**{**DS, "mtp_layers": 0})
    assert no_mtp.params == count(deepseek_like({**DS, "mtp_layers": 0}))
    assert m.expert_params == (3 + 1) * 8 * 3 * 32 * 8  # 3 MoE layers + the MTP block, 8 experts each


def test_windows_and_sinks_parameters_equal_the_modules_count():
    m = sim.llama(**OSS)
    assert m.params == count(gpt_oss_like(OSS))
    assert m.params - sim.llama(**{**OSS, "sinks": False}).params == 4 * 4  # a sink per head per layer
    assert sim.llama(**{**OSS, "window": 0}).params == m.params  # a window has no parameters


def test_published_sizes():
    ds = sim.llama_size("deepseek-v3")
    mtp = ds.params - sim.llama(**{**_shape("deepseek-v3"), "mtp_layers": 0}).params
    main = ds.params - mtp
    assert main == pytest.approx(671e9, rel=1e-3)  # DeepSeek-V3 report: 671B total
    # the Hugging Face checkpoint: 685B with the MTP module, which stores its own copy of embedding and head
    assert main + mtp + 2 * 129280 * 7168 == pytest.approx(685e9, rel=1e-3)
    assert sim.llama_size("gpt-oss-120b").params == pytest.approx(116.83e9, rel=1e-4)  # model card: 116.83B


def _shape(name):
    from simlib.sim.model_zoo import LLAMA_SIZES

    return dict(LLAMA_SIZES[name])


# ── FLOPs ──
def test_sliding_window_pairs_against_the_mask():
    for s, w in ((16, 4), (16, 1), (33, 7), (16, 16)):
        i = torch.arange(s)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)
        if w < s:
            assert attention.visible_pairs(s, w) == mask.sum().item()
    assert attention.visible_pairs(16, 16) == attention.visible_pairs(16) == 16 * 16 / 2  # no window: s²/2
    m = sim.llama(**OSS)  # half the layers windowed: the mean of both
    assert attention.mean_pairs(m, 32) == pytest.approx((32 * 32 / 2 + 32 * 4 - 4 * 3 / 2) / 2)
    assert attention.mean_pairs(m, 32, cp=2) == pytest.approx(attention.mean_pairs(m, 32) / 2)


def test_window_attention_flops_against_full():
    win, full = sim.llama(**OSS), sim.llama(**{**OSS, "window": 0})
    kernel = [
        lambda model: next(op for op in layer_ops(model, 2, attention="flash")[d] if op.kind == "attention")
        for d in ("forward", "backward")
    ]
    for pick in kernel:
        a, b = pick(win), pick(full)
        # 4·pairs·d per head and sequence (Q·Kᵀ and P·V), backward 2.5×: the ratio is the ratio of pairs
        assert a.flops / b.flops == pytest.approx(attention.mean_pairs(win, 32) / (32 * 32 / 2))
    fwd = layer_ops(full, 2, attention="flash")["forward"]
    assert next(op for op in fwd if op.kind == "attention").flops == 4 * (32 * 32 / 2) * 8 * 2 * 4
    # model FLOPs: a windowed layer's score GEMMs see w keys per query instead of s
    d = 6 * 2 * 32 * 8 * 4 * 2 * (32 - 4)  # 3 × 2 GEMMs × s·d·heads per sample over 2 layers, s - w keys
    assert full.flops_per_sample() - win.flops_per_sample() == pytest.approx(d)


def test_mla_gemms_and_attention_by_hand():
    m = sim.llama(**DS)
    t, tp = 2 * 16, 2
    ops = layer_ops(m, 2, tp=tp, attention="flash")
    gemms = {op.name: op.shape for op in ops["forward"] if op.kind == "gemm"}
    assert gemms["MLA q down"] == (t, 32, 12) and gemms["MLA kv down"] == (t, 32, 6 + 4)  # whole on each rank
    assert gemms["MLA q up"] == (t, 12, 4 * 12 // tp) and gemms["MLA kv up"] == (t, 6, 4 * 16 // tp)
    assert gemms["attention out"] == (t, 4 * 8 // tp, 32)
    core = next(op for op in ops["forward"] if op.kind == "attention")
    # Q·Kᵀ over nope + rope = 12 dims, P·V over v = 8: 2·pairs·(12 + 8) per head and sequence
    assert core.flops == pytest.approx(2 * (16 * 16 / 2) * (12 + 8) * 2 * (4 // tp))
    # model FLOPs of one MLA layer's projections: 2 per multiply-add of each weight, per token
    proj = 32 * 12 + 12 * 4 * 12 + 32 * 10 + 6 * 4 * 16 + 4 * 8 * 32
    g = m.forward_gemms(1, layers=1)
    assert sum(2 * a * b * c * n for a, b, c, n in g[:4]) + 2 * 16 * 4 * 8 * 32 == 2 * 16 * proj


def test_mla_activation_bytes_by_hand():
    m = sim.llama(**{**DS, "experts": 0, "dense_layers": 0, "mtp_layers": 0})
    s, h, f = 16, 32, 48
    # replicated: 4 tensors of h (2 norm inputs, QKV and MLP inputs) + the two latents twice (norm and up input)
    replicated = 2 * (4 * h + 2 * (12 + 6))
    # split over tp: Q (4·12), K (4·12), V (4·8), attention output (4·8), MLP up+gate (2f), down input f, silu f
    split = 2 * (4 * 12 + 4 * 12 + 4 * 8 + 4 * 8 + 2 * f + f + f)
    assert memory.activation_bytes_per_layer(m, 1, attention="flash") == s * (replicated + split)


def test_mtp_sits_on_the_last_stage_and_adds_its_flops():
    m, plain = sim.llama(**DS), sim.llama(**{**DS, "mtp_layers": 0})
    t, h, v = 16, 32, 100
    block = plain.forward_gemms(1, layers=1)  # a MoE block (round(3/4) = 1 MoE layer)
    assert m.forward_flops(1) - plain.forward_flops(1) == pytest.approx(
        2 * t * 2 * h * h + sum(2 * a * b * c * n for a, b, c, n in block) + 2 * t * h * v
    )
    names = [op.name for op in mtp_ops(m, 1)["forward"]]
    assert "MTP projection" in names and "logits" in names
    s = sim.Strategy(pp=2, attention="flash", num_micro_batches=4)
    hw = sim.preset("h100")
    assert gpt_stage(m, hw, s)["forward"] > gpt_stage(plain, hw, s)["forward"]


# ── pipeline layout (DeepSeek-V3 in Megatron-Bridge's recipes) ──
def test_deepseek_v3_layouts_and_stage_layout():
    assert deepseek_v3_layout(4, 1) == (16, 16, 16, 13)
    assert deepseek_v3_layout(16, 1) == (4,) * 15 + (1,)
    assert deepseek_v3_layout(2, 4) == (32, 29)  # chunks 0, 2, 4, 6 and 1, 3, 5, 7 of 8
    assert deepseek_v3_layout(2, 8) == (32, 29) and deepseek_v3_layout(8, 3) is None
    m = sim.llama_size("deepseek-v3")
    s = sim.Strategy(
        dp=128,
        pp=2,
        ep=32,
        virtual_stages=4,
        schedule="interleaved",
        stage_layout=(32, 29),
        attention="flash",
        num_micro_batches=16,
    )
    assert s.validate(model=m).stage_layers(61) == [32, 29]
    with pytest.raises(ValueError, match="stage_layout"):
        sim.Strategy(pp=2, stage_layout=(30, 30)).validate(model=m)
