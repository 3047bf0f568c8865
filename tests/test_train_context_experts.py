"""Context and expert parallelism in the one loop: Plan(cp=2) and Plan(ep=2) (the GPT's MoE variant) equal the
one-process run on the same global batches; plans that cannot run are refused before launch; ring attention
names the ranks when their local sequence lengths differ.

Same reference and tolerance as ``tests/test_train.py`` (a bare one-process loop; rtol/atol 1e-5 on the losses,
the pre-clipping gradient norms and the final eval loss). The MoE reference is the same bare loop on the MoE
GPT: its auxiliary loss reaches the backward inside the model (``MoEFeedForward``), in one process as on many.
"""

import sys

import cloudpickle
import pytest
import torch

from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 3
OPTIM = OptimConfig(name="adamw", lr=1e-3, weight_decay=0.1, schedule="constant", grad_clip=0.5)
TOL = dict(rtol=1e-5, atol=1e-5)
MOE = dict(moe_experts=4, moe_top_k=2)  # capacity factor 1.25: tokens are dropped
MOE_ROOMY = dict(moe_experts=4, moe_top_k=2, moe_capacity_factor=2.0)  # room for every token: none dropped


def _task(**kw):
    from simlib.projects.gpt import GPTTask

    return GPTTask.quick(**kw)


def bare_reference(task_kw, steps=STEPS):
    """One process, no simlib loop (as tests/test_train.py): losses, gradient norms, final eval loss, drops."""
    torch.manual_seed(0)
    task = _task(**task_kw)
    model = task.build_model()
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [
            dict(params=[p for p in params if p.dim() >= 2], weight_decay=OPTIM.weight_decay),
            dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0),
        ],
        lr=OPTIM.lr,
        betas=OPTIM.betas,
    )
    losses, norms, dropped = [], [], 0
    for step in range(steps):
        x, y = task.batch(step)
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, OPTIM.grad_clip)))
        opt.step()
        losses.append(float(loss.detach()))
        dropped += sum(b.mlp.stats["dropped"] for b in model.blocks) if task.moe_experts else 0
    model.eval()
    return losses, norms, task.evaluate(model)["eval_loss"], dropped


def run_plan(plan, task_kw, steps=STEPS):
    from simlib.train import train

    record = train(
        _task(**task_kw),
        plan,
        steps=steps,
        optim=OPTIM,
        log_every=1,
        eval_every=steps,
        verbose=False,
        measure_memory=False,
    )
    return (
        [r["loss"] for r in record.rows],
        [r["grad_norm"] for r in record.rows],
        record.evals[-1]["eval"]["eval_loss"],
    )


# (plan, the task's MoE fields): on 2 ranks
CASES = [
    (Plan(cp=2), {}),  # the sequence split zig-zag, ring attention over the 2 ranks
    (Plan(cp=2, accumulation=2), {}),
    (Plan(dp=2), MOE),  # MoE, experts replicated: routing over the whole batch
    (Plan(dp=2, ep=2), MOE),  # 2 experts a rank, tokens by all-to-all; drops as in one process
    (Plan(cp=2, ep=2), MOE_ROOMY),
]  # cp x ep: another token order, so equal where nothing is dropped


def test_context_and_expert_plans_equal_one_process(cluster2):
    refs = {}
    for plan, task_kw in CASES:
        key = tuple(sorted(task_kw.items()))
        if key not in refs:
            refs[key] = bare_reference(task_kw)
        ref_losses, ref_norms, ref_eval, dropped = refs[key]
        if task_kw is MOE:
            assert dropped > 0, "the MoE reference should drop tokens (capacity binds), or this checks less"
        if task_kw is MOE_ROOMY:
            assert dropped == 0, f"the roomy MoE reference dropped {dropped} tokens"
        outs = cluster2.call(run_plan, (plan, task_kw), timeout=120)
        what = f"{plan.label} {'MoE' if task_kw else 'dense'}"
        for rank, (losses, norms, eval_loss) in enumerate(outs):
            torch.testing.assert_close(losses, ref_losses, **TOL, msg=f"{what}, rank {rank}: losses")
            torch.testing.assert_close(norms, ref_norms, **TOL, msg=f"{what}, rank {rank}: gradient norms")
            torch.testing.assert_close(eval_loss, ref_eval, **TOL, msg=f"{what}, rank {rank}: eval loss")


@pytest.mark.parametrize(
    "plan, world, task_kw, words",
    [
        (Plan(cp=2, tp=2), 4, {}, r"cp=2 with tp=2 is not supported.*Plan\(dp=2, cp=2\)"),
        (Plan(cp=2, pp=2), 4, {}, "not with pipeline parallelism"),
        (Plan(dp=2, ep=2, zero_stage=1), 2, MOE, r"not with ZeRO.*Plan\(dp=2, ep=2\)"),
        (Plan(dp=2, ep=4), 2, MOE, "ep=4 does not divide the dp x cp = 2 ranks"),
        (Plan(dp=2, ep=2), 2, {}, "is dense.*--task.moe-experts"),
        (Plan(cp=3), 3, {}, "seq_len is 32: use cp in"),
        (Plan(cp=2), 4, {}, r"needs 2 ranks but the world has 4.*dp=2 cp=2"),
        (Plan(dp=2, ep=2, dp_variant="ddp"), 2, MOE, "would not be used"),
        (Plan(dp=2, tp=2), 4, MOE, "the MoE variant .* runs with dp, cp and ep"),
    ],
)
def test_bad_context_expert_plans_are_refused_before_launch(plan, world, task_kw, words):
    with pytest.raises(ValueError, match=words):
        plan.validate(world, _task(**task_kw))


def test_bad_plan_is_refused_by_the_trainer_before_any_step(cluster2):
    """The trainer validates first: every rank raises the same message, no collective is started."""
    outs = cluster2.call(_train_refused, (Plan(dp=2, ep=2, zero_stage=2),), timeout=60)
    assert all("not with ZeRO" in o for o in outs), outs


def _train_refused(plan):
    from simlib.train import train

    try:
        train(_task(**MOE), plan, steps=1, verbose=False, measure_memory=False)
    except ValueError as e:
        return str(e)
    return "no error"


def _ring_uneven(lengths):
    import torch.distributed as dist

    from simlib.parallel.context import ring_attention

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 2, lengths[rank], 4, generator=g) for _ in range(3))
    try:
        ring_attention(q, k, v, causal=True, layout="contiguous")
    except ValueError as e:
        return str(e)
    return "no error"


def test_ring_attention_names_ranks_with_other_lengths(cluster2):
    import time

    t0 = time.perf_counter()
    outs = cluster2.call(_ring_uneven, ([8, 6],), timeout=60)
    for msg in outs:  # every rank raises the same clear error, in seconds, instead of a hang or a wrong answer
        assert "same local sequence length" in msg and "rank 0: 8" in msg and "rank 1: 6" in msg, msg
    assert time.perf_counter() - t0 < 30
