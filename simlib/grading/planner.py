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
    """(model, strategy) pairs: GPT shapes and plans drawn from ``seed`` (None: fresh randomness). At least a
    quarter of them put a number of layers that pp does not divide on a pipeline (15 or 30 layers on 4 stages:
    the exercise's L / pp is then 7.5 layers, and ``L // pp`` shows)."""
    from ..sim import Strategy, gpt
    from .instances import entropy

    rng = random.Random(seed) if seed is not None else entropy()
    cases = []
    while len(cases) < n:
        uneven = len(cases) % 4 == 0  # every fourth case: L not a multiple of pp
        heads = rng.choice([8, 12, 16, 32, 64])
        # head dims 80 and 96 and sequence lengths that are not powers of two: 5*a*s/h is then not a whole number,
        # so `//` for `/` shows (issue 47); vocabularies not a multiple of 128 (50257: GPT-2's; 32001), so a
        # vocabulary padded to 128 shows
        hidden = heads * rng.choice([64, 80, 96, 128])
        layers = rng.choice([9, 15, 30, 42, 45] if uneven else [8, 12, 15, 24, 30, 32, 48])
        model = gpt(
            layers,
            hidden,
            heads,
            seq_len=rng.choice([512, 1000, 1024, 1500, 2048, 4096]),
            vocab=rng.choice([32000, 32001, 50257, 50304, 51200]),
        )
        tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([2, 4] if uneven else [1, 2, 3, 4])
        if heads % tp or (uneven and not layers % pp):
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


def reference(model, s) -> dict:
    """The simulator's bytes for the first stage (``memory_per_device(model, s, stage=0)``). The simulator places
    whole layers on a stage and refuses L that pp does not divide; the exercise's rule holds L / pp layers (an
    average), and every part is affine in the layers at a fixed parameter count, so for such L it is read off the
    simulator at the two multiples of pp around L (the same model and parameters, only the layers moved)."""
    from dataclasses import replace

    from ..sim import memory_per_device

    if model.layers % s.pp == 0:
        return memory_per_device(model, s, stage=0)
    below = model.layers - model.layers % s.pp
    lo, hi = (memory_per_device(replace(model, layers=k), s, stage=0) for k in (below, below + s.pp))
    w = (model.layers - below) / s.pp
    return {part: lo[part] + w * (hi[part] - lo[part]) for part in lo}


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


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.4g}"


def _terms(model, s) -> dict:
    """The exercise's rules, term by term, with this instance's numbers: {part: [(term, bytes, formula)]}."""
    here = model.params / (s.tp * s.pp)
    terms = {}
    for part, nbytes, stage in (("weights", 2, 3), ("gradients", 2, 2), ("optimizer", 12, 1)):
        shard = s.dp if s.zero_stage >= stage else 1
        terms[part] = [(part, nbytes * here / shard, f"{nbytes} B x params/(tp*pp) = {nbytes} x {_n(here)}")]
        terms[part][0] += (shard,)
    sbh = model.seq_len * s.micro_batch * model.hidden
    head = 5 * model.heads * model.seq_len / model.hidden
    whole = sbh * (34 + head) / s.tp
    per_layer = {"none": whole, "selective": sbh * 34 / s.tp, "full": 2 * sbh / s.tp}[s.recompute]
    in_flight = 1 if s.pp == 1 else (s.num_micro_batches if s.schedule == "gpipe" else min(s.pp, s.num_micro_batches))
    act = [
        (
            "the layers' activations",
            per_layer * model.layers / s.pp * in_flight,
            f"per layer {_n(per_layer)} x L/pp = {_n(model.layers / s.pp)} layers x {in_flight} micro-batch(es) "
            "in flight",
        )
    ]
    if s.recompute == "full":
        act.append(("the rebuilt layer's whole set", whole, f"s*b*h*(34 + 5*a*s/h)/tp = {_n(whole)}"))
    if s.pp == 1:
        act.append(("the fp32 logits", 4 * s.micro_batch * model.seq_len * model.vocab / s.tp, "4*b*s*V/tp"))
    terms["activations"] = act
    return terms


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def diagnose(part: str, got: float, model, s, parts: dict | None = None) -> str:
    """A hint naming the term of ``part`` that ``got`` gets wrong on this instance, and by how much (``parts``:
    everything the answer returned for it, which the total is judged against)."""
    want_terms = _terms(model, s)
    if part == "total":
        given = [parts.get(k) for k in PARTS[:-1]] if parts else []
        if all(type(x) is float for x in given) and given and not _near(got, sum(given)):
            return (
                f"the total must be weights + gradients + optimizer + activations: yours is {_n(got)}, the sum "
                f"of the parts you returned {_n(sum(given))}"
            )
        return "the total is the sum of the four parts: it follows them, so set the parts right first"
    want = sum(t[1] for t in want_terms[part])
    diff = got - want
    off = f"you gave {_n(got)} bytes, the rule {_n(want)} ({diff:+,.0f}, {diff / want:+.2%})" if want else ""
    if part in ("weights", "gradients", "optimizer"):
        _, value, formula, shard = want_terms[part][0]
        f, stage = got / value, {"weights": 3, "gradients": 2, "optimizer": 1}[part]
        rule = HINTS[part]
        for factor, words in (
            (s.dp, f"not sharded over dp = {s.dp}: ZeRO stage {s.zero_stage} shards the {part}"),
            (
                1 / s.dp,
                f"divided by dp = {s.dp}, but ZeRO stage {s.zero_stage} does not shard the {part} "
                f"(stage {stage} and up do)",
            ),
            (s.pp, f"{s.pp}x too large: each pipeline stage holds 1/pp of the parameters (pp = {s.pp})"),
            (s.tp, f"{s.tp}x too large: each tensor-parallel rank holds 1/tp of them (tp = {s.tp})"),
        ):
            if factor != 1 and _near(f, factor):
                return f"{part}: {words}; {off}. {rule}"
        per = {"weights": 2, "gradients": 2, "optimizer": 12}[part] * f
        if _near(per, round(per)):
            return (
                f"{part}: {round(per)} bytes per parameter of the share where the rule says "
                f"{round(per / f)}; {off}. {rule}"
            )
        return f"{part}: {off}; the rule here: {formula}" + (f" / dp = {s.dp}" if shard > 1 else "") + f". {rule}"
    return f"activations: {_activation_slip(got, model, s)}; {off}"


def _activations(model, s, **o) -> float:
    """The exercise's activation bytes, with ``o`` overriding one rule (a learner's variant of it)."""
    sbh = model.seq_len * s.micro_batch * model.hidden
    head = o.get("head", 5 * model.heads * model.seq_len / model.hidden)
    tp = o.get("tp", s.tp)
    whole = o.get("whole", sbh * (34 + head) / tp)
    per_layer = o.get("per_layer") or {"none": whole, "selective": sbh * 34 / tp, "full": 2 * sbh / tp}[s.recompute]
    flight = 1 if s.pp == 1 else (s.num_micro_batches if s.schedule == "gpipe" else min(s.pp, s.num_micro_batches))
    out = per_layer * o.get("layers", model.layers / s.pp) * o.get("in_flight", flight)
    out += whole * o.get("rebuilt", s.recompute == "full")
    return out + o.get("logits", 4 * s.micro_batch * model.seq_len * model.vocab / s.tp * (s.pp == 1))


def _activation_slip(got: float, model, s) -> str:
    """The one rule of the activations that ``got`` breaks on this instance (a learner's usual variants of each),
    or the rule's terms with their values here, to compare with one's own."""
    sbh, L, pp, tp, m = model.seq_len * s.micro_batch * model.hidden, model.layers, s.pp, s.tp, s.num_micro_batches
    head = 5 * model.heads * model.seq_len / model.hidden
    floor = 5 * model.heads * model.seq_len // model.hidden
    flight = 1 if pp == 1 else (m if s.schedule == "gpipe" else min(pp, m))
    layer_rule = "one layer keeps s*b*h*(34 + 5*a*s/h)/tp (selective: drop the 5*a*s/h term; full: 2*s*b*h/tp)"
    logits = 4 * s.micro_batch * model.seq_len * model.vocab
    padded = -(-model.vocab // 128) * 128
    no_sp = sbh * (10 + 24 / tp + head / tp)  # Korthikanti's layer without sequence parallelism
    variants = [
        (
            dict(layers=L // pp),
            f"layers per stage: L / pp = {L}/{pp} = {_n(L / pp)}, you used L // pp = {L // pp} "
            "(the rule counts the average share, not whole layers)",
        ),
        (dict(layers=-(-L // pp)), f"layers per stage: L / pp = {_n(L / pp)}, you rounded up to {-(-L // pp)}"),
        (
            dict(head=floor),
            f"the 5*a*s/h term: 5*{model.heads}*{model.seq_len}/{model.hidden} = {_n(head)}, you used "
            f"{floor} (`//` floors it: use /). {layer_rule}",
        ),
        (
            dict(tp=1),
            f"the layers' activations are not divided by tp = {tp}: {layer_rule}; sequence parallelism "
            "splits all of it over tp",
        ),
        (
            dict(
                whole=no_sp,
                per_layer={"none": no_sp, "selective": sbh * (10 + 24 / tp), "full": 2 * sbh / tp}[s.recompute],
            ),
            f"sequence parallelism is on whenever tp > 1 (here tp = {tp}): {layer_rule} — all of "
            "it split over tp, the 10*s*b*h of the LayerNorms and dropouts included",
        ),
        (
            dict(rebuilt=False),
            "the rebuilt layer's whole set is missing: full recomputation adds one layer's whole "
            f"set (the layer being rebuilt, s*b*h*(34 + 5*a*s/h)/tp = {_n(sbh * (34 + head) / tp)} bytes)",
        ),
        (
            dict(rebuilt=True),
            f"a rebuilt layer's whole set is added, but recompute={s.recompute}: only full "
            "recomputation adds one layer's whole set",
        ),
        (
            dict(logits=0),
            f"the fp32 logits are missing: with pp = 1 the fp32 logits add 4*b*s*V/tp = {_n(logits / tp)} bytes",
        ),
        (
            dict(logits=logits / tp),
            f"the fp32 logits (4*b*s*V/tp) are counted, but with pp = {pp} the first stage "
            "does not hold them (the last does): with pp = 1 the fp32 logits add 4*b*s*V/tp",
        ),
        (
            dict(logits=logits),
            f"the fp32 logits are not divided by tp = {tp}: with pp = 1 the fp32 logits add 4*b*s*V/tp",
        ),
        (
            dict(logits=logits * padded / model.vocab / tp),
            f"the fp32 logits: V = {model.vocab} as the model has it, "
            f"not padded to {padded}: with pp = 1 the fp32 logits add 4*b*s*V/tp",
        ),
        (
            dict(logits=logits / 2 / tp),
            "the logits are fp32, 4 bytes each, not 2: with pp = 1 the fp32 logits add 4*b*s*V/tp",
        ),
    ]
    for per, words in (
        (sbh * (34 + floor) / tp, "34 + 5*a*s//h (`//` floors it)"),
        (sbh * (34 + head) / tp, "34 + 5*a*s/h (no recomputation's)"),
        (sbh * 34 / tp, "34 (selective's)"),
        (2 * sbh / tp, "2 (full recomputation's)"),
        (sbh * head / tp, "5*a*s/h only"),
    ):
        variants.append(
            (dict(per_layer=per), f"bytes per layer: s*b*h/tp x {words} where recompute={s.recompute}: {layer_rule}")
        )
    variants.append(
        (
            dict(whole=sbh * (34 + floor) / tp),
            f"the rebuilt layer's set: 5*a*s/h = {_n(head)}, you used {floor} (`//` floors it: use /). {layer_rule}",
        )
    )
    for alt, why in ((pp, "pp"), (m, "m"), (min(pp, m), "min(pp, m)"), (1, "1")):
        variants.append(
            (
                dict(in_flight=alt),
                f"micro-batches in flight: {why} = {alt} where the rule says {flight} "
                f"(schedule {s.schedule}, pp = {pp}, m = {m}: 1 without a pipeline; 1F1B: min(pp, m); "
                "GPipe: all m)",
            )
        )
    variants.append(
        (
            dict(whole=sbh * (34 + head / tp), per_layer=sbh * (34 + head / tp) if s.recompute == "none" else None),
            f"sequence parallelism is on whenever tp > 1 (here tp = {tp}): all of s*b*h*(34 + 5*a*s/h) is split "
            "over tp, the 34 (LayerNorms, dropouts, the MLP) as well as the attention's 5*a*s/h",
        )
    )
    variants.append(
        (dict(layers=L), f"layers per stage: a stage holds L / pp = {_n(L / pp)} layers, you counted all {L}")
    )
    want = _activations(model, s)
    matches = []
    for change, words in variants:
        value = _activations(model, s, **change)
        if not _near(value, want) and _near(got, value) and words not in matches:
            matches.append(words)
    if len(matches) == 1:
        return matches[0]
    if matches:  # this plan cannot tell the slips apart: each gives the answer's number
        return f"{len(matches)} slips give your number on this plan (it cannot tell them apart): " + "; or ".join(
            matches
        )
    parts = "; ".join(f"{name} = {formula} = {_n(value)}" for name, value, formula in _terms(model, s)["activations"])
    return f"the rule's terms here: {parts}. Compare yours term by term: {HINTS['activations']}"


def _hint(part: str, got, model, s, parts: dict) -> str:
    if type(got) is str:
        return f"return a number of bytes for {part}"
    try:
        return diagnose(part, got, model, s, parts)
    except (ArithmeticError, ValueError):  # a zero term: no ratio to name
        return HINTS.get(part, "the total is the sum of the four parts")


def _size(case) -> tuple:
    """A failing instance's size, smallest first: the smallest model, then the fewest devices, then no pipeline."""
    model, s = case
    return (model.params, s.dp * s.tp * s.pp, s.pp, s.num_micro_batches, s.micro_batch)


@exercise("plan_memory")
def _check_plan_memory(answer, grader):
    cases = draw_cases(None, 60)  # drawn now, from the OS's randomness: no seed decides them
    failing = {}
    for (model, s), got in zip(cases, grader.ask(_parts_harness, answer, cases, what="your plan_memory")):
        want = reference(model, s)  # the first pipeline stage: what the exercise asks
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
            if not ok:
                failing.setdefault(part, []).append((model, s, got[part], want[part], got))
    for part in PARTS:
        name = f"{part} per GPU equals the simulator's on {len(cases)} drawn plans"
        if part not in failing:
            yield Result(name, True)
            continue
        # the smallest failing plan whose hint names one slip (on some plans two slips give the same number, e.g.
        # L // pp and min(pp, m) micro-batches in flight where m = pp + 1 = L / 2): else the smallest, naming both
        ranked = sorted(failing[part], key=lambda f: _size(f[:2]))
        hints = [_hint(part, f[2], f[0], f[1], f[4]) for f in ranked[:8]]
        pick = next((i for i, h in enumerate(hints) if "cannot tell them apart" not in h), 0)
        (model, s, got, want, _), hint = ranked[pick], hints[pick]
        yield Result(
            name,
            False,
            hint,
            f"{len(failing[part])} of {len(cases)} plans wrong; the smallest: {_describe(model, s)}: you gave "
            f"{got if type(got) is str else f'{got:,.0f}'}, the simulator {want:,.0f} bytes",
        )
