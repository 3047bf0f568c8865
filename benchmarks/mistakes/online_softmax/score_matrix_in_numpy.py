"""Deliberate: builds the full (T x T) score matrix and its softmax in NumPy, outside every torch operation a meter would see: right values, the whole matrix held on the Python heap (T=256, block 16)."""

import numpy as np
import torch


def online_softmax_attention(q, k, v, causal, block):
    dtype = q.dtype
    qn, kn, vn = (x.detach().float().numpy() for x in (q, k, v))
    t = qn.shape[-2]
    s = qn @ np.swapaxes(kn, -1, -2) / np.sqrt(qn.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((t, t), dtype=bool), 1), -np.inf, s)
    s = np.exp(s - s.max(-1, keepdims=True))
    out = (s / s.sum(-1, keepdims=True)) @ vn
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).to(dtype)


ANSWER = online_softmax_attention
KIND = "deliberate"
PROVE = {"world_size": 2, "T": 256, "block": 16}
