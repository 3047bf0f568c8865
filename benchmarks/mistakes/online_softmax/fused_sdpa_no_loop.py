"""Deliberate: calls torch's fused F.scaled_dot_product_attention (the grader's own reference) instead of writing the loop: right values, no online softmax of its own (T=10, block 4)."""

import torch.nn.functional as F


def online_softmax_attention(q, k, v, causal, block):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).to(q.dtype)


ANSWER = online_softmax_attention
KIND = "deliberate"
PROVE = {"world_size": 2, "T": 10, "block": 4}
