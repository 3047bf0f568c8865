"""Checks for lesson 05b: an online-softmax (FlashAttention-style) attention forward, blockwise over K/V.

``answer(q, k, v, causal, block) -> out`` for q, k, v of shape (batch, heads, T, head_dim). Every call of the
check draws its instances afresh (a seed from the operating system, recorded in the detail): sizes where the block
does not divide T, causal and not, float32 and bfloat16, and scores far past ``exp``'s float32 range, where the
running max is the whole point. Values are compared with ``F.scaled_dot_product_attention`` in float64; memory by
a census of every tensor the answer's torch operations produce (a ``TorchDispatchMode``): the largest must stay
below the full (T x T) score matrix; on a long sequence what it holds outside torch (NumPy, Python buffers) is
weighed too, by ``tracemalloc``; and torch's fused attention kernels, seen at the dispatcher, are refused. When an answer is wrong, the grader recomputes the classic mistakes itself and
names the one it matches.
"""

from __future__ import annotations

from .core import Result, exercise, max_error

_LARGE = 40.0  # q scaled so that scores reach ~100: exp() of them overflows float32 (past 88.7) without the max
_RISE = 22.0  # the rising case: keys after the first block shifted along q's direction, scores ~ _RISE**2/sqrt(d)
_TOL = {"float32": 2e-5, "bfloat16": 2.0**-8}  # float32: against float64; bfloat16: relative, half a bf16 ulp
_FUSED = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")  # torch's own kernels


def _instances(seed: int) -> list[dict]:
    """The cases one check draws (``seed``: fresh each call): (B, H, T, d, block, causal, dtype, large, rise).

    Each mistake it is built for shows on every draw: ``large`` scores past exp's float32 range (no running max);
    ``rise``, keys after the first block whose scores exceed the first block's by far more than 88.7 (a max taken
    from the first block only overflows); a long bfloat16 sequence in small blocks (bf16 accumulation drifts by
    more than half a bf16 ulp, and a float32 output shows); a long one (T >= 256) where the full score matrix,
    even held outside torch (NumPy), outweighs everything a blockwise answer keeps."""
    import random

    rng = random.Random(seed)
    cases = []
    for causal in (False, True):
        t = rng.randint(17, 70)
        block = rng.choice([b for b in (4, 5, 7, 8, 12, 16) if t % b])  # a block that does not divide T
        cases.append(
            dict(
                b=rng.randint(1, 2),
                h=rng.randint(1, 3),
                t=t,
                d=rng.choice((8, 16)),
                block=block,
                causal=causal,
                dtype="float32",
                large=False,
            )
        )
    t = rng.randint(64, 96)
    block = rng.choice([b for b in (4, 5, 6, 7) if t % b])
    cases.append(dict(b=1, h=2, t=t, d=16, block=block, causal=rng.random() < 0.5, dtype="bfloat16", large=False))
    cases.append(
        dict(
            b=1, h=2, t=rng.randint(30, 60), d=8, block=rng.choice((5, 7, 11)), causal=True, dtype="float32", large=True
        )
    )
    t = rng.randint(30, 60)
    cases.append(
        dict(b=1, h=2, t=t, d=16, block=rng.choice((4, 5, 7)), causal=rng.random() < 0.5, dtype="float32", rise=True)
    )
    cases.append(dict(b=1, h=1, t=rng.randint(8, 12), d=8, block=64, causal=True, dtype="float32", large=False))
    t = rng.randint(256, 300)
    cases.append(dict(b=1, h=2, t=t, d=8, block=rng.choice((40, 48, 56)), causal=rng.random() < 0.5, dtype="float32"))
    for case in cases:
        case.setdefault("large", False)
        case.setdefault("rise", False)
    return cases


def _inputs(case: dict, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (case["b"], case["h"], case["t"], case["d"])
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    if case["large"]:
        q = q * _LARGE
    if case.get("rise"):  # q and the keys after the first block share a direction u: their scores ~ _RISE**2/sqrt(d)
        u = torch.randn(case["d"], generator=g, dtype=torch.float64)
        u = u / u.norm()
        q = q + _RISE * u
        k[..., : case["block"], :] *= 0.05  # the first block's scores stay near 0
        k[..., case["block"] :, :] += _RISE * u
    dtype = getattr(torch, case["dtype"])
    return [x.to(dtype) for x in (q, k, v)]


def _reference(q, k, v, causal: bool, diagonal: int = 0):
    """Softmax attention in float64 (``diagonal``: -1 masks the diagonal too, +1 lets i see i+1: the off-by-ones)."""
    import torch

    q, k, v = (x.double() for x in (q, k, v))
    if diagonal == 0:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool).triu(1 + diagonal)
    scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1))  # a row with nothing visible: 0, not NaN
    return weights @ v


def _case_error(case: dict, seed: int, out) -> tuple[float, str]:
    """(the largest error, what is wrong: "" when ``out`` is softmax attention on ``case`` within its tolerance)."""
    import torch

    q, k, v = _inputs(case, seed)
    ref = _reference(q, k, v, case["causal"])
    if not isinstance(out, torch.Tensor):
        return float("inf"), f"returned a {type(out).__name__}, not a tensor"
    err = max_error(out, ref) if out.shape == ref.shape else float("inf")
    if case["dtype"] == "bfloat16":  # half a bf16 ulp of each value (the output's own rounding), relative
        excess = float(((out - ref).abs() - _TOL["bfloat16"] * ref.abs()).max()) if err < 1e9 else err
        within, words = excess <= 1e-5, f"{_TOL['bfloat16']:g} x |value| (half a bf16 ulp)"
    else:
        tol = 1e-3 if case["rise"] else _TOL["float32"]  # scores ~120: float32's rounding of them ~1e-5
        within, words = err <= tol, f"{tol:g}"
    if not within or not torch.isfinite(out).all():
        return err, f"max error {err:.3g} (tolerance {words})"
    return err, ""


def _attention_words(case: dict) -> str:
    kind = ", scores past exp's range" if case["large"] else ", a later block's scores far above the first's"
    kind = kind if case["large"] or case["rise"] else ""
    return (
        f"batch {case['b']}, {case['h']} head(s), T={case['t']}, head dim {case['d']}, block {case['block']}, "
        f"{'causal' if case['causal'] else 'not causal'}, {case['dtype']}{kind}"
    )


def _attention_smallest(grader, answer, case: dict, seed: int) -> str:
    """The hint's words for the smallest failing instance Hypothesis finds below ``case`` (the same kind: dtype,
    causal, large or rising scores, one block or several): fewer heads, a shorter sequence, a smaller block."""
    from .instances import around, shrink, smallest_words

    several = case["block"] < case["t"]
    strategy = around(
        case,
        dict(b=1, h=1, t=2, d=(8, 16), block=2),
        keep=lambda c: (c["block"] < c["t"]) == several and (not c["rise"] or c["t"] > c["block"]),
    )

    def differs(c):
        out = grader.ask(_census_harness, answer, c, seed, what="your attention")
        return _case_error(c, seed, out.get("out"))[1]

    small, what = shrink(strategy, differs, case, grader)
    return smallest_words(small, what, _attention_words) if small != case else ""


def _census_harness(answer, case, seed):
    """The answer on one instance, watched: its output, the largest tensor any of its torch ops produced, the
    fused attention kernels of torch it called, and the peak of what it held on the Python heap (NumPy's arrays
    and bytearrays included: tracemalloc sees them, torch's allocator does not)."""
    import tracemalloc

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    biggest, fused = {"numel": 0, "op": ""}, set()

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(name in str(func) for name in _FUSED):
                fused.add(str(func))
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor) and o.numel() > biggest["numel"]:
                    biggest.update(numel=o.numel(), op=str(func), shape=list(o.shape))
            return out

    def watched():
        q, k, v = (x.clone() for x in _inputs(case, seed))
        if case["t"] < 256:  # the heap is weighed on the long case only (tracing slows every allocation)
            with Census():
                return answer(q, k, v, case["causal"], case["block"]), 0
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            with Census():
                out = answer(q, k, v, case["causal"], case["block"])
            return out, tracemalloc.get_traced_memory()[1] - base
        finally:
            if not tracing:
                tracemalloc.stop()

    out, heap = watched()
    if case["t"] >= 256:  # the case whose heap is weighed: a first call's imports and caches are not the answer's
        out, heap = watched()
    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__}
    return {
        "type": "Tensor",
        "out": out.detach().double().clone(),
        "dtype": str(out.dtype).removeprefix("torch."),
        "biggest": biggest,
        "fused": sorted(fused),
        "heap": heap,
    }


@exercise("online_softmax")
def _online_softmax(answer, grader):
    import os

    import torch

    seed = int.from_bytes(os.urandom(4), "little")
    cases = _instances(seed)
    drawn = f"instances drawn with seed {seed}"
    outs = [grader.ask(_census_harness, answer, case, seed + i, what="your attention") for i, case in enumerate(cases)]
    for out in outs:
        if out.get("type") != "Tensor":
            yield Result("returns a tensor", False, hint=f"return the attention output, not a {out.get('type')}")
            return
    yield Result("returns a tensor", True)

    shrunk = []  # the smallest failing instance's words, once found (the first failing comparison asks for it)

    def compare(indices):
        worst, where = 0.0, ""
        for i in indices:
            err, wrong = _case_error(cases[i], seed + i, outs[i]["out"])
            if wrong:
                if not shrunk:
                    shrunk.append(_attention_smallest(grader, answer, cases[i], seed + i))
                return False, f"{cases[i]}: {wrong}; {drawn}"
            worst = max(worst, err)
            where = f"worst error {worst:.2g}; {drawn}"
        return True, where

    def matches(i, fn, rows=slice(None)):
        case, out = cases[i], outs[i]["out"]
        q, k, v = _inputs(case, seed + i)
        ref = fn(q, k, v, case)
        if out.shape != ref.shape:
            return False
        out, ref = out[..., rows, :], ref[..., rows, :]
        return bool(torch.isfinite(out).all()) and max_error(out, ref) <= 1e-3

    plain = [i for i, c in enumerate(cases) if c["dtype"] == "float32" and not c["large"] and not c["rise"]]
    ok, detail = compare(plain)
    hint = ""
    if not ok:
        causal = [i for i in plain if cases[i]["causal"]]
        for shift, what in ((-1, "the diagonal is masked too"), (1, "each position also sees the next key")):
            rows = slice(1, None) if shift == -1 else slice(None)  # row 0 sees nothing when the diagonal is masked
            if causal and all(
                matches(i, lambda q, k, v, c, s=shift: _reference(q, k, v, True, s), rows) for i in causal
            ):
                hint = (
                    f"causal off by one: {what}. Position i attends to keys 0..i inclusive: mask key j only "
                    "where j > i (torch.ones(t, t).triu(1))"
                )
                break
        one_block = [i for i in plain if cases[i]["block"] >= cases[i]["t"]]
        if not hint and one_block and compare(one_block)[0]:
            hint = (
                "right with one block, wrong with several: the merge. When a block raises the running max m, "
                "multiply the accumulator AND the running denominator by exp(m_old − m_new) before adding the "
                "new block's exp(s − m_new) terms"
            )
        hint = hint or (
            "the output differs from softmax(q·kᵀ/√d)·v: check the scale 1/√d, the mask of a partial last "
            "block (T not a multiple of the block), and the final division by the running denominator"
        )
    smallest = lambda ok: "" if ok or not shrunk else shrunk[0]  # noqa: E731 - the hint's last sentence
    yield Result(
        "equals softmax attention (float32; blocks that do not divide T; causal and not)",
        ok,
        hint + smallest(ok),
        detail,
    )

    fused = sorted({op for out in outs for op in out["fused"]})
    yield Result(
        "computes attention itself (no fused attention kernel of torch's)",
        not fused,
        ""
        if not fused
        else "the exercise is to write the online softmax yourself, block by block: "
        "F.scaled_dot_product_attention (and nn.MultiheadAttention, which calls it) runs torch's fused kernel, "
        "which is the check's reference, not your code",
        ", ".join(fused),
    )
    big = [i for i, c in enumerate(cases) if c["large"]]
    ok_big, detail_big = compare(big)
    yield Result(
        "stays finite and exact when scores pass exp's range (|q·k| ~ 100)",
        ok_big,
        ""
        if ok_big
        else "subtract the running max before exp: exp(s − m) never overflows; exp(s) does past 88.7 in "
        "float32, and inf/inf is NaN" + smallest(ok_big),
        detail_big,
    )
    rise = [i for i, c in enumerate(cases) if c["rise"]]
    ok_rise, detail_rise = compare(rise)
    yield Result(
        "stays finite when a later block's scores exceed the first block's by far (the max is a running max)",
        ok_rise,
        ""
        if ok_rise
        else "the max must be a running max: when a later block holds larger scores, m_new = max(m, the block's "
        "max), rescale the accumulator and the denominator by exp(m − m_new), then add exp(s − m_new). A max "
        "taken from the first block only lets exp(s − m) overflow (past 88.7 in float32) once a later block's "
        "scores are larger" + smallest(ok_rise),
        detail_rise,
    )
    half = [i for i, c in enumerate(cases) if c["dtype"] == "bfloat16"]
    wrong_dtype = [f"T={cases[i]['t']}: {outs[i]['dtype']}" for i in half if outs[i]["dtype"] != "bfloat16"]
    yield Result(
        "returns the inputs' dtype (bfloat16 in, bfloat16 out)",
        not wrong_dtype,
        ""
        if not wrong_dtype
        else "cast the output back to the inputs' dtype (acc / l).to(q.dtype): the accumulation runs in float32, "
        "the result is bfloat16 like q, k and v",
        "; ".join(wrong_dtype),
    )
    ok_half, detail_half = compare(half)
    yield Result(
        "works in bfloat16 (within half a bf16 ulp of the exact values)",
        ok_half,
        ""
        if ok_half
        else "keep the running max, denominator and accumulator in float32 (q.float(), k.float(), v.float()) and "
        "round to bfloat16 once, at the end: bf16's 8-bit mantissa, rounded at every block, loses the sum"
        + smallest(ok_half),
        detail_half,
    )
    over = []
    for case, out in zip(cases, outs):
        full = case["b"] * case["h"] * case["t"] * case["t"]
        if case["block"] < case["t"] and out["biggest"]["numel"] >= full:
            over.append(
                f"T={case['t']}, block={case['block']}: {out['biggest']['op']} made a tensor of shape "
                f"{out['biggest']['shape']} (the full score matrix has {full} elements)"
            )
        elif case["t"] >= 256 and out["heap"] >= 2 * full:  # half the fp32 matrix, on the Python heap (NumPy)
            over.append(
                f"T={case['t']}, block={case['block']}: {out['heap']:,} bytes held outside torch (NumPy arrays or "
                f"Python buffers) at the peak; the full score matrix is {4 * full:,} bytes in float32"
            )
    yield Result(
        "never materialises the full (T x T) score matrix",
        not over,
        ""
        if not over
        else "compute the scores one K/V block at a time (q @ k[..., s:s+block, :]ᵀ): T x block "
        "at a time, never T x T, in torch or outside it (NumPy); that is the memory FlashAttention saves",
        "; ".join(over[:2]),
    )
