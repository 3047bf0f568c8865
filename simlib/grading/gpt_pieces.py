"""Checks of the GPT project's learner pieces (``simlib.projects.gpt.run.PIECES``, ``solutions/10_gpt_pieces.ipynb``).

gpt_grad_sync      the bucketed data-parallel gradient synchronisation the GPT trains with: lesson 02's checks
                   (``bucket_data_parallel``: values at 2/3/4 ranks, one all-reduce per bucket, the overlap read
                   from the timeline), then what the GPT's run adds: frozen and unused parameters, the
                   data-parallel *group* of a dp x tp mesh, and the bytes on the wire (the kernel's counters)
gpt_tp_attention   the attention block split by heads: output, dL/dx and every weight gradient against the
                   unsplit block at drawn heads / head sizes / tp, two all-reduces of B*S*H, and a refusal naming
                   the cause when the heads do not divide over the ranks
"""

from __future__ import annotations

from .bucket import _bucket_cap, _check_bucket
from .core import Result, exercise
from .dp_common import (
    _DP_LR,
    _DP_STEPS,
    _all_close,
    _check_training,
    _diagnose_grads,
    _problem_words,
    dp_problem,
    dp_shrunk,
)

# ───────────────────────── gpt_grad_sync ─────────────────────────


def _grads_of(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _sync_harness(answer_cls, steps, lr, cap_mb, problems, groups_of):
    """The answer on drawn problems, SGD for ``steps`` steps. ``groups_of``: None (every rank one data-parallel
    group, ``problems[0]``) or a list of rank lists (a dp x tp mesh: each list a data-parallel group, training its
    own ``problems[i]``; the answer gets ``group=``). Returns this rank's first gradients and final weights."""
    import torch
    import torch.distributed as dist

    from .dp_common import _tiny_problem

    rank = dist.get_rank()
    group, index, members = None, 0, list(range(dist.get_world_size()))
    if groups_of is not None:
        made = [dist.new_group(ranks) for ranks in groups_of]  # every rank makes every group, in the same order
        index = next(i for i, ranks in enumerate(groups_of) if rank in ranks)
        group, members = made[index], groups_of[index]
    model, x, y = _tiny_problem(problems[index])
    n, me = len(members), members.index(rank)
    rows = x.shape[0] // n
    xs, ys = x[me * rows : (me + 1) * rows], y[me * rows : (me + 1) * rows]
    dp = (
        answer_cls(model, bucket_cap_mb=cap_mb)
        if group is None
        else answer_cls(model, bucket_cap_mb=cap_mb, group=group)
    )
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    grads = None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(dp(xs), ys).backward()
        dp.finish_gradient_synchronization()
        if step == 0:
            grads = _grads_of(model)
        opt.step()
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(grads=grads, state=[p.detach().clone() for p in model.parameters()], numel=numel, index=index)


def _reference(steps, lr, problem):
    """dp_common's single-process reference, with the optimizer over the trainable parameters only."""
    import torch

    from .dp_common import _tiny_problem

    model, x, y = _tiny_problem(problem)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    grads = None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 0:
            grads = _grads_of(model)
        opt.step()
    return dict(grads=grads, state=[p.detach().clone() for p in model.parameters()])


def _draw(count, **kw):
    from hypothesis import strategies as st

    from .instances import draw

    return [dict(p) for p in draw(st.tuples(*(dp_problem(**kw) for _ in range(count))), 1)[0]]


def _sync_differs(grader, answer):
    """What the answer gets wrong on (world, problem), "" where it is right: for the shrinking (dp_shrunk)."""

    def differs(world, p):
        ref = _reference(_DP_STEPS, _DP_LR, p)
        cap_mb = _bucket_cap({k: v for k, v in p.items() if k not in ("frozen", "unused")})
        outs = grader.run(world, _sync_harness, answer, _DP_STEPS, _DP_LR, cap_mb, [p], None)
        ok, detail, _ = _diagnose_grads(outs, ref)
        trained = _check_training(outs, ref, world, _DP_STEPS)
        return (f"gradients: {detail}" if not ok else "") or ("" if trained.passed else f"weights: {trained.detail}")

    return differs


def _wide(problem: dict) -> dict:
    """The problem made wide enough that its gradients, not the messages' headers, fill the wire."""
    return {**problem, "width": 64 + problem["width"] * 8}


@exercise("gpt_grad_sync")
def _check_gpt_grad_sync(answer, grader):
    # what the GPT's training adds to lesson 02's checks (first: a failure here needs no more runs): a frozen
    # parameter and one the forward never uses (p.grad None on every rank)
    (odd,) = _draw(1, frozen=True, unused=True)
    odd["depth"] = max(odd["depth"], 2)
    cap_mb = _bucket_cap({k: v for k, v in odd.items() if k not in ("frozen", "unused")})
    ref = _reference(_DP_STEPS, _DP_LR, odd)
    outs = grader.run(3, _sync_harness, answer, _DP_STEPS, _DP_LR, cap_mb, [odd], None)
    ok, detail, hint = _diagnose_grads(outs, ref)
    trained = _check_training(outs, ref, 3, _DP_STEPS)
    smallest = "" if ok and trained.passed else dp_shrunk(grader, odd, 3, _sync_differs(grader, answer), min_depth=2)
    if not ok and "hang" not in hint:
        hint += (
            ". A bucket holding a parameter that got no gradient never fills during backward: send it from "
            "finish_gradient_synchronization (a zero where p.grad is None) and leave that p.grad None"
            + _problem_words(odd)
        )
    yield Result(
        "3 ranks, a frozen and an unused parameter: gradients equal the global-batch gradient",
        ok,
        hint + ("" if ok else smallest),
        detail,
    )
    trained.hint += smallest if ok else ""
    yield trained
    # the data-parallel group of a dp=2 x tp=2 mesh: ranks {0, 2} and {1, 3}, each pair on its own problem (same
    # shapes, other numbers: averaging over the whole world then runs, and gives the wrong mean)
    first, other = _draw(2)
    pair = [first, {**first, "seed": other["seed"]}]
    refs = [_reference(_DP_STEPS, _DP_LR, p) for p in pair]
    cap_mb = _bucket_cap(pair[0])
    outs = grader.run(4, _sync_harness, answer, _DP_STEPS, _DP_LR, cap_mb, pair, [[0, 2], [1, 3]])
    bad = [r for r, out in enumerate(outs) if not _all_close(out["grads"], refs[out["index"]]["grads"])]
    yield Result(
        "4 ranks as dp=2 x tp=2: each data-parallel group (ranks 0+2, ranks 1+3) averages its own gradients",
        not bad,
        "under a dp x tp plan your class gets group= (the ranks holding the same model shard): pass it to every "
        "collective (dist.all_reduce(buf, group=self.group, async_op=True)) and divide by "
        "dist.get_world_size(self.group), not by the whole world's size",
        f"wrong on rank(s) {bad}" if bad else "",
    )
    # lesson 02's checks (one source of truth): values at 2/3/4 ranks, one all-reduce per bucket, the overlap
    yield from _check_bucket(answer, grader)
    # bytes below the Python name: what each rank sent on the wire (the kernel's TCP counters, read here)
    wide = _wide(_draw(1)[0])
    cap_mb = _bucket_cap(wide)
    outs = grader.run(3, _sync_harness, answer, 1, _DP_LR, cap_mb, [wide], None, wire=True)
    on_wire = grader.wire_last
    if on_wire is None:
        yield Result("bytes on the wire (skipped: the kernel's counters cannot be read here)", True)
        return
    n, grad_bytes = 3, outs[0]["numel"] * 4
    sent = [sum(v[0] for (src, _), v in on_wire.items() if src == r) for r in range(n)]
    # one all-reduce of the gradients: 2(n-1)/n of them per rank (nccl-tests' bus factor); 25 % for Gloo's
    # framing and an optional broadcast of the weights at start (DDP's) on top
    bound = 2 * (n - 1) / n * grad_bytes * 1.25 + grad_bytes + 64 * 1024
    yield Result(
        "3 ranks: each rank sends about one all-reduce of the gradients a step (the kernel's TCP counters)",
        max(sent) <= bound,
        "averaging the gradients is one all-reduce per bucket: each rank puts 2(n-1)/n of the gradients on the "
        "wire. Gathering every rank's gradients (all_gather) or sending a bucket more than once moves more",
        f"most sent by one rank: {max(sent):,} bytes; one all-reduce of {grad_bytes:,} gradient bytes is "
        f"{2 * (n - 1) / n * grad_bytes:,.0f} per rank",
    )


# ───────────────────────── gpt_tp_attention ─────────────────────────


def tp_attention_case(tp: int | None = None, divisible: bool = True):
    """A Hypothesis strategy of an attention block: heads a multiple of ``tp`` (2, 3 or 4 when None) or, with
    ``divisible=False``, not; odd head sizes; a secret seed."""
    from hypothesis import strategies as st

    def build(tp_, k, extra, head_dim, batch, seq, seed):
        heads = tp_ * k + (0 if divisible else extra)
        return dict(tp=tp_, heads=heads, head_dim=head_dim, batch=batch, seq=seq, seed=seed)

    return st.builds(
        build,
        st.sampled_from((2, 3, 4)) if tp is None else st.just(tp),
        st.integers(1, 3),
        st.integers(1, tp - 1 if tp else 1),
        st.integers(1, 7),
        st.integers(1, 3),
        st.integers(2, 9),
        st.integers(0, 2**62),
    )


def _dense_case(case: dict):
    import torch

    from ..models import SelfAttention

    torch.manual_seed(case["seed"] % 2**31)
    hidden = case["heads"] * case["head_dim"]
    attn = SelfAttention(hidden, case["heads"], causal=True)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)  # nonzero biases: a bias added on every rank shows
    x = torch.randn(case["batch"], case["seq"], hidden)
    dy = torch.randn(case["batch"], case["seq"], hidden)
    return attn, x, dy


def _tp_rows(case: dict, rank: int):
    """This rank's rows of the fused qkv (laid out (3, heads, head_dim)) and its columns of out."""
    import torch

    h, d, tp = case["heads"], case["head_dim"], case["tp"]
    local = h // tp
    rows = torch.arange(3 * h * d).view(3, h, d)[:, rank * local : (rank + 1) * local].reshape(-1)
    cols = torch.arange(rank * local * d, (rank + 1) * local * d)
    return rows, cols


def _tp_reference(case: dict) -> dict:
    attn, x, dy = _dense_case(case)
    x.requires_grad_(True)
    y = attn(x)
    (y * dy).sum().backward()
    g = {k: p.grad.clone() for k, p in attn.named_parameters()}
    return dict(y=y.detach(), dx=x.grad.clone(), grads=g)


def _tp_harness(answer_cls, cases, refusal, groups=None):
    """The answer on each case (every rank builds the same dense block and splits it with the answer); the
    all-reduces counted at the dispatcher; ``refusal``: a case whose heads do not divide, expected to raise (None:
    none). ``groups``: rank lists, the tensor-parallel groups of a dp x tp mesh (the answer gets its group)."""
    import torch.distributed as dist

    from .contracts import recorder

    group = None
    if groups:
        made = [dist.new_group(ranks) for ranks in groups]  # every rank makes every group, in the same order
        group = made[next(i for i, ranks in enumerate(groups) if dist.get_rank() in ranks)]
    out = []
    for case in cases:
        attn, x, dy = _dense_case(case)
        x.requires_grad_(True)
        with recorder() as rec:
            mod = answer_cls(attn, group)
            y = mod(x)
            forward = list(rec.calls)
            (y * dy).sum().backward()
        params = dict(mod.named_parameters()) if hasattr(mod, "named_parameters") else {}
        out.append(
            dict(
                y=y.detach(),
                dx=None if x.grad is None else x.grad.clone(),
                shapes={k: tuple(p.shape) for k, p in params.items()},
                grads={k: None if p.grad is None else p.grad.clone() for k, p in params.items()},
                forward=[c for c in forward if c["op"].startswith("all_reduce")],
                backward=[c for c in rec.calls[len(forward) :] if c["op"].startswith("all_reduce")],
            )
        )
    refused = None
    try:
        if refusal is not None:
            answer_cls(_dense_case(refusal)[0], group)
    except Exception as e:  # noqa: BLE001 - any clear error is a refusal; its words are judged below
        refused = f"{type(e).__name__}: {e}"
    return dict(cases=out, refused=refused, rank=dist.get_rank(group))


def _case_words(case: dict) -> str:
    return (
        f" (smallest failing case: {case['heads']} heads of size {case['head_dim']} over tp={case['tp']}, "
        f"batch {case['batch']}, sequence {case['seq']})"
    )


def _near(got, want) -> bool:
    """Equal up to float32 summation order (the split sums its terms in another order), relative to the scale."""
    import torch

    return (
        got is not None
        and tuple(got.shape) == tuple(want.shape)
        and bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5 * (1 + float(want.abs().max()))))
    )


def _diagnose_tp(case, ref, got, rank) -> tuple[str, str]:
    """("", "") when this rank's results are right, else (what is wrong, hint)."""
    import torch

    rows, cols = _tp_rows(case, rank)
    h, d, tp = case["heads"], case["head_dim"], case["tp"]
    want = {
        "qkv.weight": (3 * h * d // tp, h * d),
        "qkv.bias": (3 * h * d // tp,),
        "out.weight": (h * d, h * d // tp),
        "out.bias": (h * d,),
    }
    if got["shapes"] != want:
        return (
            f"rank {rank}'s parameters {got['shapes']}",
            f"hold this rank's share as self.qkv (nn.Linear, {want['qkv.weight']}) and self.out (nn.Linear, "
            f"{want['out.weight']}, with the whole bias {want['out.bias']}), and no other parameter",
        )
    if not _near(got["y"], ref["y"]):
        if _near(got["y"], ref["y"] + (tp - 1) * _bias(case)):
            return "output", "the out bias was added on every rank: add it once, after the all-reduce of x @ W_r^T"
        contiguous = torch.arange(rank * 3 * h * d // tp, (rank + 1) * 3 * h * d // tp)
        if not torch.equal(rows, contiguous):
            return (
                "output",
                "the output differs from the unsplit block. qkv's rows are laid out (3, heads, head_dim): all q, "
                "then all k, then all v; a rank's heads are a block of each of q, k and v, not one contiguous "
                "block of 3H/tp rows. And the row-parallel out needs the all-reduce of its partial products",
            )
        return "output", "the output differs from the unsplit block: all-reduce the out projection's partial sums"
    if not _near(got["dx"], ref["dx"]):
        return (
            "dL/dx",
            "the output is right but dL/dx is not: each rank's heads see all of x, so the gradient of x is the "
            "sum over the ranks (Megatron's f: identity forward, all-reduce of the gradient in backward)",
        )
    pick = {"qkv.weight": rows, "qkv.bias": rows}
    for key, g in got["grads"].items():
        full = ref["grads"][key]
        mine = full[pick[key]] if key in pick else full[:, cols] if key == "out.weight" else full
        if not _near(g, mine):
            return (
                f"the gradient of {key}",
                "the forward is right but this weight's gradient is not"
                + (
                    f" ({tp}x too large: the all-reduce's backward is the identity, not another all-reduce)"
                    if _near(g, mine * tp)
                    else ""
                ),
            )
    return "", ""


def _bias(case):
    attn, _, _ = _dense_case(case)
    return attn.out.bias.detach()


def _first_wrong(cases, outs):
    """(what, hint, rank) of the smallest case some rank got wrong, or None."""
    for case, i in sorted(((c, i) for i, c in enumerate(cases)), key=lambda ci: ci[0]["heads"]):
        ref = _tp_reference(case)
        for out in outs:
            what, hint = _diagnose_tp(case, ref, out["cases"][i], out["rank"])
            if what:
                return what, hint + _case_words(case), out["rank"]
    return None


@exercise("gpt_tp_attention")
def _check_gpt_tp_attention(answer, grader):
    from hypothesis import strategies as st

    from .instances import draw

    world_sizes = (2, 3, 4)
    drawn = draw(
        st.tuples(
            *(st.lists(tp_attention_case(tp), min_size=2, max_size=2) for tp in world_sizes),
            *(tp_attention_case(tp, divisible=False) for tp in world_sizes),
        ),
        1,
    )[0]
    cases, refusals = dict(zip(world_sizes, drawn[:3])), dict(zip(world_sizes, drawn[3:]))
    for tp in world_sizes:
        outs = grader.run(tp, _tp_harness, answer, cases[tp], refusals[tp])
        wrong = _first_wrong(cases[tp], outs)
        yield Result(
            f"tp={tp}: output, dL/dx and every weight gradient equal the unsplit attention block",
            wrong is None,
            wrong[1] if wrong else "",
            f"{wrong[0]} wrong on rank {wrong[2]}" if wrong else "",
        )
        first, case = outs[0]["cases"][0], cases[tp][0]
        bsh = case["batch"] * case["seq"] * case["heads"] * case["head_dim"]
        counts = (len(first["forward"]), len(first["backward"]))
        sizes = [c["elements"] for c in first["forward"] + first["backward"]]
        yield Result(
            f"tp={tp}: one all-reduce of B*S*H in forward, one in backward",
            counts == (1, 1) and all(s == bsh for s in sizes),
            "the heads need nothing from other ranks: the only forward message is the all-reduce of the out "
            "projection's partial sums (B*S*H values), the only backward one the all-reduce of dL/dx",
            f"all-reduces in forward, backward: {counts}, elements {sizes}; B*S*H = {bsh}",
        )
        bad = refusals[tp]
        refused = [o["refused"] for o in outs]
        named = all(r and str(bad["heads"]) in r and str(tp) in r for r in refused)
        yield Result(
            f"tp={tp}: {bad['heads']} heads (not a multiple of {tp}) are refused, naming the cause",
            named,
            "when num_heads % tp != 0 some rank would hold a part of a head: raise a ValueError that names the "
            f"number of heads and the tensor-parallel size (e.g. '{bad['heads']} heads do not divide over {tp} "
            "ranks')",
            f"what rank 0 said: {refused[0]}" if refused[0] else "no error was raised",
        )
    # inside the GPT's Plan(dp=2, tp=2): the tensor-parallel groups are 2 of the 4 ranks (0+1, 2+3)
    mesh = [dict(c, tp=2) for c in cases[2]]
    outs = grader.run(4, _tp_harness, answer, mesh, None, [[0, 1], [2, 3]])
    wrong = _first_wrong(mesh, outs)
    yield Result(
        "4 ranks as dp=2 x tp=2: each tensor-parallel pair (ranks 0+1, ranks 2+3) splits the heads over its group",
        wrong is None,
        (
            wrong[1] + ". Under a mesh your group is 2 of the 4 ranks: take your heads by dist.get_rank(group) and "
            "pass group to every collective"
        )
        if wrong
        else "",
        f"{wrong[0]} wrong on group rank {wrong[2]}" if wrong else "",
    )


# ───────────────────────── the milestone with the learner's pieces ─────────────────────────

from .milestones import milestone  # noqa: E402 - after the pieces' exercises: the milestone grades each first
from .pieces_milestone import pieces_milestone  # noqa: E402

milestone("gpt")  # "gpt_milestone": the project's MILESTONE (simlib/projects/gpt/run.py)
pieces_milestone("gpt")  # "gpt_pieces_milestone": the same, trained with the learner's grad_sync and tp_attention
