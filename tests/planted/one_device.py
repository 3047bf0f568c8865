"""Wrong online-softmax attention forwards (lesson 05b): each a classic mistake, named for it."""

import torch


def _blocks(q, k, v, causal, block, merge, use_max=True, mask_shift=0):
    work = torch.float32
    out_dtype = q.dtype
    q, k, v = (x.to(work) for x in (q, k, v))
    t, scale = q.shape[-2], q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"), dtype=work)
    den = torch.zeros(q.shape[:-1], dtype=work)
    acc = torch.zeros_like(q)
    rows = torch.arange(t).unsqueeze(1)
    for s in range(0, t, block):
        scores = q @ k[..., s : s + block, :].transpose(-2, -1) * scale
        if causal:
            cols = torch.arange(s, min(s + block, t)).unsqueeze(0)
            scores = scores.masked_fill(cols > rows + mask_shift, float("-inf"))
        m, den, acc = merge(m, den, acc, scores, v[..., s : s + block, :], use_max)
    return (acc / den.unsqueeze(-1)).to(out_dtype)


def _right_merge(m, den, acc, scores, v, use_max):
    new = torch.maximum(m, scores.amax(-1)) if use_max else torch.zeros_like(m)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    p = torch.exp(scores - safe.unsqueeze(-1))
    alpha = torch.exp(m - safe)
    return new, den * alpha + p.sum(-1), acc * alpha.unsqueeze(-1) + p @ v


def _denominator_not_rescaled(m, den, acc, scores, v, use_max):
    new = torch.maximum(m, scores.amax(-1))
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    p = torch.exp(scores - safe.unsqueeze(-1))
    alpha = torch.exp(m - safe)
    return new, den + p.sum(-1), acc * alpha.unsqueeze(-1) + p @ v


def missing_running_max(q, k, v, causal, block):
    """exp(s) with no max subtracted: right on small scores, inf/inf = NaN once q·k passes ~88."""
    return _blocks(q, k, v, causal, block, _right_merge, use_max=False)


def wrong_rescale(q, k, v, causal, block):
    """The accumulator is rescaled by exp(m_old − m_new), the running denominator is not."""
    return _blocks(q, k, v, causal, block, _denominator_not_rescaled)


def materialises_full_matrix(q, k, v, causal, block):
    """Right values, wrong memory: the whole (T x T) score matrix, then softmax."""
    scale = q.shape[-1] ** -0.5
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        t = q.shape[-2]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def causal_off_by_one(q, k, v, causal, block):
    """Each position also sees the next key (j > i + 1 masked instead of j > i)."""
    return _blocks(q, k, v, causal, block, _right_merge, mask_shift=1)


def _first_block_max(m, den, acc, scores, v, use_max):
    if torch.isinf(m).all():  # the first block: its max, kept for every later block
        m = scores.amax(-1)
    p = torch.exp(scores - m.unsqueeze(-1))
    return m, den + p.sum(-1), acc + p @ v


def max_from_first_block(q, k, v, causal, block):
    """The max taken from the first block and never updated: a later block with larger scores overflows exp."""
    return _blocks(q, k, v, causal, block, _first_block_max)


def accumulates_in_input_dtype(q, k, v, causal, block):
    """No float32: bfloat16 inputs give bf16 scores, exp terms, denominator and accumulator, rounded at each
    block."""
    scale = q.shape[-1] ** -0.5
    t = q.shape[-2]
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    den, acc = torch.zeros(q.shape[:-1], dtype=q.dtype), torch.zeros_like(q)
    rows = torch.arange(t).unsqueeze(1)
    for s in range(0, t, block):
        scores = q @ k[..., s : s + block, :].transpose(-2, -1) * scale
        if causal:
            scores = scores.masked_fill(torch.arange(s, min(s + block, t)).unsqueeze(0) > rows, float("-inf"))
        m, den, acc = _right_merge(m, den, acc, scores, v[..., s : s + block, :], True)
    return acc / den.unsqueeze(-1)


PLANTED = {
    "max_from_first_block": max_from_first_block,
    "accumulates_in_input_dtype": accumulates_in_input_dtype,
    "missing_running_max": missing_running_max,
    "wrong_rescale": wrong_rescale,
    "materialises_full_matrix": materialises_full_matrix,
    "causal_off_by_one": causal_off_by_one,
}
