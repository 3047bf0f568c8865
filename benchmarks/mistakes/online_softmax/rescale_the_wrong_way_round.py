"""Honest: rescales by exp(m_new - m) instead of exp(m - m_new): on the first block m is -inf, the factor is inf and 0 * inf makes the output NaN (any input)."""

import torch


def online_softmax_attention(q, k, v, causal, block):
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    t, scale = q.shape[-2], q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"))
    denom = torch.zeros(q.shape[:-1])
    acc = torch.zeros_like(q)
    rows = torch.arange(t).unsqueeze(1)
    for start in range(0, t, block):
        kb, vb = k[..., start : start + block, :], v[..., start : start + block, :]
        s = q @ kb.transpose(-2, -1) * scale
        if causal:
            cols = torch.arange(start, start + kb.shape[-2]).unsqueeze(0)
            s = s.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe.unsqueeze(-1))
        alpha = torch.exp(safe - m)
        denom = denom * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + p @ vb
        m = m_new
    return (acc / denom.unsqueeze(-1)).to(dtype)


ANSWER = online_softmax_attention
KIND = "honest"
PROVE = {"world_size": 2, "T": 10, "block": 4}
