"""Check for lesson 07's activation-checkpoint exercise: which blocks to recompute under a memory budget (the
bytes measured with autograd's saved-tensor hooks, the optimum by exhaustive search, fresh problems drawn at check
time)."""

from __future__ import annotations

from .core import AnswerTimeout, Result, UsedTheGrader, exercise, refuse_grader_calls

# ---- activation checkpoints under a memory budget (measured with autograd's saved-tensor hooks) ----

# ``gates[i]``: extra element-wise gates in block i (h = h * sigmoid(h)): bytes kept for backward with almost no
# FLOPs, so bytes per FLOP differ from block to block and "fewest FLOPs" is not "largest blocks first"
_CK = dict(width=16, ffns=(64, 16, 48, 96, 32, 80), gates=(0, 5, 1, 0, 3, 0), batch=32)


def checkpoint_problem():
    """The exercise's model (residual blocks of different widths), its batch, and what each block costs.

    ``activation_bytes[i]``: bytes block i's forward leaves for backward (measured); ``input_bytes[i]``: what it
    keeps when checkpointed (its input); ``recompute_flops[i]``: its forward, done again in backward.
    """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width, ffn, gates):
            super().__init__()
            self.up, self.down, self.gates = nn.Linear(width, ffn), nn.Linear(ffn, width), gates

        def forward(self, x):
            h = torch.relu(self.up(x))
            for _ in range(self.gates):
                h = h * torch.sigmoid(h)
            return x + self.down(h)

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(_CK["width"], f, g) for f, g in zip(_CK["ffns"], _CK["gates"])])
    x = torch.randn(_CK["batch"], _CK["width"], requires_grad=True)
    per_block = []
    h = x
    for block in model:
        kept, h = kept_activation_bytes(block, h)
        per_block.append(kept)
    inputs = [x.numel() * x.element_size()] * len(model)
    # two matmuls (2 FLOPs per multiply-add each), a gate ~4 FLOPs per element (sigmoid, multiply)
    flops = [4 * _CK["batch"] * _CK["width"] * f + 4 * g * _CK["batch"] * f for f, g in zip(_CK["ffns"], _CK["gates"])]
    return model, x, per_block, inputs, flops


def kept_activation_bytes(module, *inputs):
    """Run ``module(*inputs)``; return (bytes autograd saved for backward, parameters excluded; output)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    return sum(seen.values()), out


def _measure_choice(chosen):
    """Bytes the model keeps for backward with ``chosen`` blocks checkpointed (measured: a checkpointed block's
    input is what autograd still saves for it)."""
    from ..parallel.recompute import checkpoint_blocks, uncheckpoint

    model, x, *_ = checkpoint_problem()
    blocks = checkpoint_blocks(list(model), chosen)
    try:
        kept, _ = kept_activation_bytes(model, x)
    finally:
        uncheckpoint(blocks)
    return kept


def _best_cost(acts, inputs, flops, budget):
    from itertools import combinations

    n = len(acts)
    best = None
    for k in range(n + 1):
        for s in combinations(range(n), k):
            if sum(inputs[i] if i in s else acts[i] for i in range(n)) <= budget:
                cost = sum(flops[i] for i in s)
                best = cost if best is None else min(best, cost)
    return best


def _best_set(acts, inputs, flops, budget):
    from itertools import combinations

    n = len(acts)
    fits = [
        s
        for k in range(n + 1)
        for s in combinations(range(n), k)
        if sum(inputs[i] if i in s else acts[i] for i in range(n)) <= budget
    ]
    return min(fits, key=lambda s: (sum(flops[i] for i in s), s)) if fits else tuple(range(n))


def _exact(acts, inputs, flops, budget):
    """The bytes the optimum set for ``budget`` keeps: a budget it meets exactly."""
    s = _best_set(acts, inputs, flops, budget)
    return sum(inputs[i] if i in s else acts[i] for i in range(len(acts)))


@exercise("checkpoint_placement")
def _check_checkpoint_placement(answer, grader):
    _, _, acts, inputs, flops = checkpoint_problem()
    total, floor = sum(acts), sum(inputs)
    # budgets where greedy rules (largest blocks first, most bytes per FLOP first) and the optimum differ, and
    # budgets met exactly by the optimum (so "<" instead of "<=" shows)
    exact = [_exact(acts, inputs, flops, int(total * f)) for f in (0.8, 0.75, 0.6)]
    # and a budget below the floor, where nothing fits: the answer is every block, the least memory there is
    budgets = [total] + [b + 1 for b in exact] + exact + [int(total * 0.45), floor, floor - 1]
    answers = grader.ask(
        _chosen_harness, answer, [(acts, inputs, flops, b) for b in budgets], None, what="your function"
    )
    for budget, (_, chosen) in zip(budgets, answers):
        if any(not 0 <= i < len(acts) for i in chosen):
            yield Result(
                f"budget {budget:,} B: valid block indices",
                False,
                f"return indices of blocks, 0 .. {len(acts) - 1}",
                f"got {chosen}",
            )
            return
        if budget < floor:
            every = sorted(chosen) == list(range(len(acts)))
            yield Result(
                f"budget {budget:,} B (below the {floor:,} B that checkpointing every block keeps): every block",
                every,
                _NOTHING_FITS,
                "" if every else f"got {chosen}, which keeps {_measure_choice(chosen):,} B",
            )
            if not every:
                return
            continue
        kept = _measure_choice(chosen)
        fits = kept <= budget
        predicted = sum(inputs[i] if i in chosen else acts[i] for i in range(len(acts)))
        hint = (
            "a checkpointed block still keeps its input (input_bytes[i]): count it, not zero"
            if predicted != sum(acts[i] for i in range(len(acts)) if i not in chosen)
            and sum(acts[i] for i in range(len(acts)) if i not in chosen) <= budget < predicted
            else "checkpoint more blocks: what stays is activation_bytes of the others plus input_bytes of the "
            "checkpointed ones, and it must be <= budget"
        )
        yield Result(
            f"budget {budget:,} B: measured activations fit",
            fits,
            hint,
            f"measured {kept:,} B kept for backward with blocks {chosen} checkpointed",
        )
        if not fits:
            return
        cost, best = sum(flops[i] for i in chosen), _best_cost(acts, inputs, flops, budget)
        best_set = _best_set(acts, inputs, flops, budget)
        best_kept = sum(inputs[i] if i in best_set else acts[i] for i in range(len(acts)))
        if len(chosen) == len(acts):
            hint = (
                "checkpointing every block fits any budget, but recomputes the whole forward: checkpoint only "
                "what the budget needs"
            )
        elif best_kept == budget and kept < budget and cost == _best_cost(acts, inputs, flops, budget - 1):
            hint = (
                f"blocks {list(best_set)} keep exactly the budget ({budget:,} B) and recompute less: a set that "
                "keeps exactly the budget fits (kept <= budget, not <)"
            )
        else:
            hint = (
                f"blocks {list(best_set)} also fit and recompute {cost - best:,} fewer FLOPs: blocks differ in "
                "bytes per FLOP, so neither the largest blocks first nor the best ratio first is optimal. Try "
                "every subset (there are only 2^6), or think knapsack"
            )
        yield Result(
            f"budget {budget:,} B: no more recomputation than needed",
            cost == best,
            hint,
            f"your blocks recompute {cost:,} FLOPs; the least that fits is {best:,}",
        )
        if cost != best:  # the first budget that shows the mistake names it; later ones would only guess
            return
    yield _checkpoint_fresh_problems(answer, grader)


_NOTHING_FITS = (
    "when no choice fits the budget, return every block (list(range(n))): checkpointing all of them keeps the "
    "least memory there is, while an empty list (no checkpoint at all) keeps the most"
)


def _chosen_harness(answer, problems, limit):
    """In a worker (the answer runs there, never in the grading process): the blocks the answer chooses for each
    problem, as ("ok", sorted ints). ``limit``: each call is refused if it calls the grader and stopped after
    ``limit`` s, and the first that fails ends the list with ("used" | "timeout" | "error", why); else it raises."""
    from ..plain import exact_str
    from . import core

    out, old = [], core.ANSWER_CALL_LIMIT
    core.ANSWER_CALL_LIMIT = limit or old
    try:
        for acts, inputs, flops, budget in problems:
            try:
                got = (
                    answer(list(acts), list(inputs), list(flops), budget)
                    if limit is None
                    else refuse_grader_calls(answer, list(acts), list(inputs), list(flops), budget)
                )
                out.append(("ok", sorted(set(int.__int__(int(i)) for i in got))))
            except Exception as exc:  # noqa: BLE001 - the learner's code on a new problem
                if limit is None:
                    raise
                kind = {UsedTheGrader: "used", AnswerTimeout: "timeout"}.get(type(exc), "error")
                out.append((kind, exact_str(exc) if kind != "error" else f"{type(exc).__name__}: {exact_str(exc)}"))
                break
    finally:
        core.ANSWER_CALL_LIMIT = old
    return out


def _checkpoint_fresh_problems(answer, grader, count: int = 40):
    """Problems drawn now from a grader-private source (``secrets``: no answer can rebuild them), 1 to 8 blocks,
    any budget between the floor and the total: an answer right only on the lesson's model (a hard-coded set, a
    range that misses the last block or the largest subsets) fails here. The seed is shown to reproduce it."""
    import random
    import secrets

    from . import core
    from .answer_box import run_boxed
    from .busy import Load

    seed = secrets.randbits(32)
    draw = random.Random(seed)
    problems = []
    for case in range(count):
        # 1 to 12 blocks (an exhaustive search capped at 8 blocks fails), smallest first: the first failure
        # reported is the smallest problem that fails
        n = 1 + case % 12
        acts = [draw.randint(10, 4000) for _ in range(n)]
        inputs = [draw.randint(1, a) for a in acts]
        # one problem in eight has a budget below the floor (nothing fits: every block is the answer)
        low = case % 8 == 5
        budget = (
            draw.randint(max(0, sum(inputs) // 2), sum(inputs) - 1) if low else draw.randint(sum(inputs), sum(acts))
        )
        problems.append((acts, inputs, [draw.randint(1, 5000) for _ in range(n)], budget))
    problems.sort(key=lambda p: len(p[0]))
    # run in a fresh process of its own, where an audit hook (no Python code can remove it) refuses the grader's
    # modules and files: the watch is not in reach of the answer (answer_box.py)
    factor = Load.now().factor
    answers = run_boxed(
        answer.data, [list(p) for p in problems], core.ANSWER_CALL_LIMIT * factor, timeout=grader.timeout * factor * 2
    )
    answers += [["error", "no verdict"]] * (len(problems) - len(answers)) if answers and answers[-1][0] == "ok" else []
    for (acts, inputs, flops, budget), (kind, chosen) in zip(problems, answers):
        if kind == "ok":
            chosen = [int(i) for i in chosen]
        n = len(acts)
        what = f"{n} blocks, activation_bytes={acts}, input_bytes={inputs}, recompute_flops={flops}, budget={budget}"
        if kind == "used":
            return Result(
                "40 fresh random problems: your own solver",
                False,
                "solve the problem with your own code: calling the grader's reference is not an answer",
                chosen,
            )
        if kind == "timeout":
            return Result(
                "40 fresh random problems: least recomputation that fits",
                False,
                "with n blocks there "
                "are 2^n subsets (4,096 for 12): an exhaustive search ends in well under a second; look for a loop "
                "that never ends on some problems",
                f"{chosen} on {what} (seed {seed})",
                status="timeout",
            )
        if kind != "ok":
            return Result(
                "40 fresh random problems: least recomputation that fits",
                False,
                "your function raised on a problem other than the lesson's: it must work for any number "
                "of blocks and any budget",
                f"{chosen} on {what} (seed {seed})",
            )
        if budget < sum(inputs):  # nothing fits
            if sorted(chosen) != list(range(n)):
                return Result(
                    "40 fresh random problems: least recomputation that fits",
                    False,
                    _NOTHING_FITS,
                    f"{what} (nothing fits: checkpointing every block keeps {sum(inputs):,} B): you chose {chosen} "
                    f"(seed {seed})",
                )
            continue
        kept = sum(inputs[i] if i in chosen else acts[i] for i in range(n)) if all(0 <= i < n for i in chosen) else None
        cost, best = sum(flops[i] for i in chosen if 0 <= i < n), _best_cost(acts, inputs, flops, budget)
        if kept is None or kept > budget or cost != best:
            got = "invalid indices" if kept is None else f"kept {kept:,} B, recompute {cost:,}"
            return Result(
                "40 fresh random problems: least recomputation that fits",
                False,
                "right on the lesson's model but not on another: consider every block (indices 0 .. n-1) "
                "and every subset size from 0 to n, with kept = activation_bytes of the others + "
                "input_bytes of the checkpointed ones <= budget",
                f"{what}: you chose {chosen} ({got}); the optimum recomputes {best:,} (seed {seed})",
            )
    return Result("40 fresh random problems: least recomputation that fits", True, detail=f"seed {seed}")
