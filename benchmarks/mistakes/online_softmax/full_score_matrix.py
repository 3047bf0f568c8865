"""Honest: computes the whole (T x T) score matrix and its softmax in one go, ignoring block: the values are right but the full matrix is materialised (T=10, block 4)."""

import torch


def online_softmax_attention(q, k, v, causal, block):
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    t, scale = q.shape[-2], q.shape[-1] ** -0.5
    s = q @ k.transpose(-2, -1) * scale
    if causal:
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(dtype)


ANSWER = online_softmax_attention
KIND = "honest"
PROVE = {"world_size": 2, "T": 10, "block": 4}
