"""GPT-OSS's eager operators as Megatron-Core runs them: its experts' clamped activation and output bias added per
expert (simlib.sim.cluster_ops.expert_eager_ops), and YaRN RoPE applied unfused (simlib.sim.layer). The priced bytes
are checked against the reads and writes PyTorch's dispatcher sees when the same sequence of tensor operations runs
forward and backward."""

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from simlib import sim
from simlib.sim import cluster_ops, scale_runs
from simlib.sim.layer import layer_ops
from simlib.sim.layer_strategy import module_recompute_ops


class _Traffic(TorchDispatchMode):
    """Bytes each aten operator reads (its tensor inputs) and writes (its outputs); views move nothing."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if outs and not func._schema.is_mutable and all(o.untyped_storage().data_ptr() in storages for o in outs):
            return out  # a view of an input
        self.bytes += sum(t.numel() * t.element_size() for t in ins + outs)
        return out


def _traffic(fn, inputs):
    """(forward, backward) bytes of ``fn(*inputs)`` and its gradient."""
    with _Traffic() as fwd:
        y = fn(*inputs)
    grad = torch.randn_like(y)
    with _Traffic() as bwd:
        y.backward(grad)
    return fwd.bytes, bwd.bytes


def _clamped(y, bound=7.0):  # the gate half clamped from above, the linear half both ways, joined again
    gate, linear = y.chunk(2, -1)
    return torch.cat((gate.clamp(max=bound), linear.clamp(min=-bound, max=bound)), -1)


def _bias_per_expert(out, biases, probs, counts):  # each expert's rows plus its bias times the row's probability
    parts = zip(torch.split(out, counts), biases.unbind(0), torch.split(probs, counts))
    return torch.cat([rows + b * p for rows, b, p in parts]).to(out.dtype)


def _rope_scaled(t, freqs, mscale=1.35):  # t·cos + rotate_half(t)·sin with scaled cos and sin, the pass-through
    rot = freqs.shape[-1]  # part (empty here) joined back
    t, rest = t[..., :rot], t[..., rot:]
    cos, sin = (torch.cos(freqs) * mscale).to(t.dtype), (torch.sin(freqs) * mscale).to(t.dtype)
    first, second = torch.chunk(t, 2, dim=-1)
    return torch.cat((t * cos + torch.cat((-second, first), dim=-1) * sin, rest), dim=-1)


def _oss(**kw):
    return sim.transformer(
        2,
        64,
        4,
        seq_len=32,
        vocab=100,
        kv_heads=2,
        ffn_hidden=64,
        gated_mlp=True,
        norm="rmsnorm",
        position="rope",
        dropout=False,
        experts=4,
        top_k=2,
        expert_bias=True,
        router_bias=True,
        activation_clamp=7.0,
        **kw,
    )


def test_priced_bytes_are_the_dispatched_reads_and_writes():
    """bf16 rows × f (clamp) and rows × h (bias): forward and backward bytes as priced, to the small tensors
    (the probabilities, the biases) that the count per element leaves out."""
    model = _oss()
    rows, f, h, experts = 4096, model.expert_width, model.hidden, 4
    ops = cluster_ops.expert_eager_ops(model, rows, 2)
    y = torch.randn(rows, 2 * f, dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = _traffic(_clamped, [y])
    assert fwd == pytest.approx(ops["clamp"][0].bytes, rel=1e-3)
    assert bwd == pytest.approx(ops["clamp_bwd"][0].bytes, rel=1e-3)
    out = torch.randn(rows, h, dtype=torch.bfloat16, requires_grad=True)
    biases = torch.randn(experts, h, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(rows, 1, dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = _traffic(lambda o, b, p: _bias_per_expert(o, b, p, [rows // experts] * experts), [out, biases, probs])
    assert fwd == pytest.approx(ops["bias"][0].bytes, rel=0.03)
    assert bwd == pytest.approx(ops["bias_bwd"][0].bytes, rel=0.03)


def test_only_a_clamped_or_biased_expert_gets_them_in_place():
    """GPT-OSS's experts: the clamp right before the fused activation and its gradient right after the
    activation's; the bias after the down projection and its gradient before the down projection's. Qwen3's
    experts (no clamp, no bias) get none; each switch adds only its own."""
    t = 256
    names = {k: [op.name for op in v] for k, v in cluster_ops.moe_ops(_oss(), t, 1, 2).items()}
    fwd, bwd = names["forward"], names["backward"]
    assert fwd.index("experts activation clamp + cat (eager)") + 1 == fwd.index("experts SwiGLU")
    assert fwd.index("experts down (grouped)") + 1 == fwd.index("experts output bias x prob, per expert (eager)")
    assert bwd.index("experts activation backward") + 1 == bwd.index("experts activation clamp backward (eager)")
    assert bwd.index("experts output bias backward (eager)") < bwd.index("experts down (grouped) dgrad")
    plain = cluster_ops.moe_ops(sim.llama_size("qwen3-30b-a3b"), t, 1, 8)
    assert not [op for ops in plain.values() for op in ops if "eager" in op.name]
    only_bias = cluster_ops.expert_eager_ops(replace(_oss(), activation_clamp=0.0), 100)
    assert only_bias["clamp"] == only_bias["clamp_bwd"] == [] and only_bias["bias"]


def test_moe_act_recompute_runs_the_clamps_again():
    forward = cluster_ops.moe_ops(_oss(), 256, 1, 2)["forward"]
    again = [op.name for op in module_recompute_ops(forward, ("moe_act",))]
    assert again == ["recompute experts activation clamp + cat (eager)", "recompute experts SwiGLU"]


def test_gpt_oss_states_its_clamp_and_expert_bias():
    m = sim.llama_size("gpt-oss-120b")
    assert m.activation_clamp == 7.0 and m.expert_bias
    assert m.params == pytest.approx(116.83e9, rel=1e-4)  # the clamp adds no parameters (model card: 116.83B)
    assert not sim.llama_size("qwen3-30b-a3b").expert_bias
    assert _oss().expert_bias  # the switch reaches the spec
    assert not sim.transformer(2, 64, 4, expert_bias=True).expert_bias  # no experts: nothing to bias
    with pytest.raises(ValueError, match="activation_clamp"):
        replace(m, activation_clamp=-1.0)


def test_gpt_oss_runs_slow_down_and_nothing_else_moves():
    """Every GPT-OSS row of the scale set predicts a slower step with the two costs than without; a row of
    another model reads neither switch."""
    rows = scale_runs.load_rows()
    oss = [r for r in rows if r["model"] == "gpt-oss-120b" and not scale_runs.why_inexpressible(r)]
    assert oss
    for row in oss:
        m = sim.llama_size(row["model"], seq_len=row["seq_len"])
        hw, s = scale_runs.hardware_of(row), scale_runs.strategy_of(row, m)
        with_them = sim.predict(m, hw, s).step_time
        without = sim.predict(replace(m, activation_clamp=0.0, expert_bias=False), hw, s).step_time
        assert with_them > without
    other = sim.llama_size("qwen3-235b-a22b")
    assert other.activation_clamp == 0.0 and not other.expert_bias


def test_yarn_rope_with_a_scale_is_priced_unfused_on_the_query_width():
    """A YaRN concentration factor (GPT-OSS: 0.1·ln 32 + 1) sends Megatron-Core's RoPE down the unfused path: its
    bytes, Q and K and their cos/sin tables, are the dispatched ones; without it the fused kernel's read + write.
    Q's width is heads × head_dim, not the hidden size."""
    import math

    assert sim.llama_size("gpt-oss-120b").rope_mscale == pytest.approx(0.1 * math.log(32) + 1)
    m = _oss(head_dim=24, rope_mscale=1.35)
    b, s, d = 2, m.seq_len, m.head_dim
    assert m.heads * d != m.hidden
    ops = {op.name: op.bytes for phase in layer_ops(m, b, attention="flash").values() for op in phase}
    measured = [0, 0]
    for heads in (m.heads, m.kv):  # Megatron-Core's layout [s, b, heads, d], one call for Q and one for K
        x, freqs = torch.randn(s, b, heads, d, dtype=torch.bfloat16, requires_grad=True), torch.randn(s, 1, 1, d)
        fwd, bwd = _traffic(lambda q: _rope_scaled(q, freqs, mscale=m.rope_mscale), [x])
        measured = [measured[0] + fwd, measured[1] + bwd]
    assert measured[0] == pytest.approx(ops["rotary embedding on Q, K (unfused: YaRN scale)"], rel=0.01)
    assert measured[1] == pytest.approx(ops["rotary embedding backward (unfused: YaRN scale)"], rel=0.01)
    plain = {op.name: op.bytes for op in layer_ops(replace(m, rope_mscale=1.0), b, attention="flash")["forward"]}
    assert plain["rotary embedding on Q, K"] == 2 * 2 * b * s * (m.heads + m.kv) * d
    with pytest.raises(ValueError, match="rope_mscale"):
        replace(m, rope_mscale=0.0)
