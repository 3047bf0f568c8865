"""Checks for lesson 13: the memory one GPU of a plan's first pipeline stage needs (the planner's first filter).

The learner writes ``plan_memory(model, strategy) -> dict`` (weights, gradients, optimizer, activations, total,
bytes per device) for a GPT-style model (``sim.gpt``: LayerNorm, GeLU, unfused attention, dropout) under
mixed-precision Adam. The grader draws the models and the plans itself, at check time, from the OS's randomness
(so a table of answers cannot pass), and compares each part with the simulator's own
``simlib.sim.memory_per_device(model, strategy, stage=0)`` — the function the planner prunes with (which, for the
course's own GPT, takes the largest stage through the same function: its last stage holds the head and the loss). The answer runs on one worker process
(:meth:`Grader.ask`), which sends back plain numbers; nothing of it runs in the process that computes the verdict.
"""

from __future__ import annotations

import random

from .core import Result, exercise

PARTS = ("weights", "gradients", "optimizer", "activations", "total")
HINTS = {
    "weights": "16-bit weights are 2 bytes per parameter of this rank's share (params / (tp x pp)); only ZeRO "
    "stage 3 shards them over dp",
    "gradients": "16-bit gradients are 2 bytes per parameter of the rank's share; ZeRO stage 2 and 3 shard them "
    "over dp (stage 1 does not)",
    "optimizer": "Adam's fp32 master weights, momentum and variance are 12 bytes per parameter of the rank's "
    "share; every ZeRO stage >= 1 shards them over dp",
    "activations": "per layer s*b*h*(34 + 5*a*s/h)/tp (selective: drop the 5*a*s/h term; full: 2*s*b*h/tp), "
    "times the layers of one stage (L/pp), times the micro-batches in flight (1 without a "
    "pipeline; 1F1B: min(pp, m); GPipe: all m); full recomputation adds one layer's whole set "
    "(the layer being rebuilt); with pp = 1 the fp32 logits add 4*b*s*V/tp",
}


def draw_cases(seed: int | None = None, n: int = 40) -> list:
    """(model, strategy) pairs: GPT shapes and plans drawn from ``seed`` (None: fresh randomness)."""
    from ..sim import Strategy, gpt
    from .instances import entropy

    rng = random.Random(seed) if seed is not None else entropy()
    cases = []
    while len(cases) < n:
        heads = rng.choice([8, 12, 16, 32, 64])
        # head dims 80 and 96 and sequence lengths that are not powers of two: 5*a*s/h is then not a whole number,
        # so `//` for `/` shows (issue 47); vocabularies not a multiple of 128 (50257: GPT-2's; 32001), so a
        # vocabulary padded to 128 shows
        hidden = heads * rng.choice([64, 80, 96, 128])
        layers = rng.choice([8, 12, 24, 32, 48])
        model = gpt(
            layers,
            hidden,
            heads,
            seq_len=rng.choice([512, 1000, 1024, 1500, 2048, 4096]),
            vocab=rng.choice([32000, 32001, 50257, 50304, 51200]),
        )
        tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4])
        if layers % pp or heads % tp:
            continue
        m = rng.choice([1, 2, 4, 8, 16])
        s = Strategy(
            dp=rng.choice([1, 2, 8, 64]),
            tp=tp,
            pp=pp,
            micro_batch=rng.choice([1, 2, 4]),
            num_micro_batches=m,
            zero_stage=rng.choice([0, 1, 2, 3]),
            recompute=rng.choice(["none", "selective", "full"]),
            schedule=rng.choice(["1f1b", "gpipe"]),
            sequence_parallel=tp > 1,
        )
        cases.append((model, s))
    return cases


def _describe(model, s) -> str:
    return (
        f"{model.name} (L={model.layers}, h={model.hidden}, a={model.heads}, s={model.seq_len}, "
        f"V={model.vocab}) with dp={s.dp} tp={s.tp} pp={s.pp} mb={s.micro_batch} m={s.num_micro_batches} "
        f"zero={s.zero_stage} recompute={s.recompute} schedule={s.schedule}"
    )


def _parts_harness(answer, cases):
    """In a worker: the answer's parts for each case, as {part: float, or the repr of what it gave}, or (at the
    first answer that is not a dict with every part) the repr of it, which ends the list."""
    from ..plain import exact_str
    from ..sim import memory
    from .contracts import module_functions, switched_off

    out = []
    for model, s in cases:
        with switched_off(*module_functions(memory)):  # the simulator's memory model is the reference
            got = answer(model, s)  # an exception fails the check (NotImplementedError: not done yet)
        if not isinstance(got, dict) or any(k not in got for k in PARTS):
            return out + [exact_str(f"{got!r:.200}")]
        parts = {}
        for part in PARTS:
            try:
                parts[part] = float.__float__(float(got[part]))
            except (TypeError, ValueError):
                parts[part] = exact_str(f"{got[part]!r:.40}")
        out.append(parts)
    return out


@exercise("plan_memory")
def _check_plan_memory(answer, grader):
    from ..sim import memory_per_device

    cases = draw_cases(None, 60)  # drawn now, from the OS's randomness: no seed decides them
    first = {}
    for (model, s), got in zip(cases, grader.ask(_parts_harness, answer, cases, what="your plan_memory")):
        want = memory_per_device(model, s, stage=0)  # the first pipeline stage: what the exercise asks
        if type(got) is not dict:
            yield Result(
                "returns a dict with weights, gradients, optimizer, activations and total",
                False,
                f"return dict({', '.join(f'{k}=...' for k in PARTS)}) in bytes",
                f"got {got}",
            )
            return
        for part in PARTS:
            ok = type(got[part]) is float and abs(got[part] - want[part]) <= 1e-6 * max(1.0, abs(want[part]))
            if not ok and part not in first:
                first[part] = (model, s, got[part], want[part])
    for part in PARTS:
        bad = first.get(part)
        if bad is None:
            yield Result(f"{part} per GPU equals the simulator's on {len(cases)} drawn plans", True)
            continue
        model, s, got, want = bad
        hint = HINTS.get(part, "the total is the sum of the four parts")
        yield Result(
            f"{part} per GPU equals the simulator's on {len(cases)} drawn plans",
            False,
            hint,
            f"{_describe(model, s)}: you gave {got if type(got) is str else f'{got:,.0f}'}, the simulator "
            f"{want:,.0f} bytes",
        )
