"""The one training loop: every plan equals one process on the same global batches; bad plans and failing
ranks are reported, not hidden.

The reference is a bare hand-written loop (no simlib): the quick GPT, AdamW with weight decay on matrices,
global gradient-norm clipping, the whole global batch each step, in one process.

Tolerance: none picked by hand. Each plan computes the same mathematics with sums in another order (two
half-batch means averaged by DP, k micro-batch means by accumulation, matmul reductions split over TP ranks,
micro-batches through a pipeline), which moves results in their last bits, and AdamW can enlarge such a difference
where a gradient element is near zero. So the reference is also run twice with the samples of every batch permuted
(the same training, its sums in another order), and ``simlib.debug.parity.verdict`` draws the band from those twins:
per step, 4x the largest difference they showed, plus 16 float32 ulps. Every plan's losses, gradient norms and
final eval loss must stay inside it. A real bug (a gradient divided twice, not averaged, a stage's tied gradient
lost) changes the gradient norm by a factor (AdamW and clipping are nearly blind to a gradient's scale, so the
logged pre-clipping gradient norm is compared too): ``test_a_gradient_divided_twice_leaves_the_band``.
"""

import sys

import cloudpickle
import pytest
import torch

from simlib.debug import parity
from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 3
OPTIM = OptimConfig(name="adamw", lr=1e-3, weight_decay=0.1, schedule="constant", grad_clip=0.5)
TWINS = 2  # permuted runs of the reference that draw the band


def _task():
    from simlib.projects.gpt import GPTTask

    return GPTTask.quick()


def bare_reference(steps=STEPS, permutation=None, grad_divisor=1.0):
    """One process, no simlib loop: the losses and gradient norms per step, and the final eval loss.
    ``permutation``: the samples of every batch in another (seeded) order; ``grad_divisor``: a planted bug."""
    torch.manual_seed(0)
    task = _task()
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
    losses, norms = [], []
    for step in range(steps):
        x, y = task.batch(step)
        if permutation is not None:
            order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1000 * permutation + step))
            x, y = x[order], y[order]
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        for p in params:
            p.grad /= grad_divisor
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, OPTIM.grad_clip)))
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses, norms, task.evaluate(model)["eval_loss"]


def assert_parity(reference, out, label):
    """Losses, gradient norms and eval loss of ``out`` inside the bands the permuted twins draw around the reference."""
    ref, twins = reference
    for i, quantity in enumerate(("loss", "gradient norm", "eval loss")):
        series = (lambda r: r[i]) if i < 2 else (lambda r: [r[i]])
        v = parity.verdict(
            series(ref), [series(t) for t in twins], series(out), "one process", label, quantity=quantity
        )
        assert v.agree, str(v)


def run_plan(plan, steps=STEPS):
    from simlib.train import train

    record = train(
        _task(), plan, steps=steps, optim=OPTIM, log_every=1, eval_every=steps, verbose=False, measure_memory=False
    )
    return (
        [r["loss"] for r in record.rows],
        [r["grad_norm"] for r in record.rows],
        record.evals[-1]["eval"]["eval_loss"],
    )


@pytest.fixture(scope="module")
def reference():
    return bare_reference(), [bare_reference(permutation=seed) for seed in range(TWINS)]


def test_a_gradient_divided_twice_leaves_the_band(reference):
    """The band can fail: summation-order noise (a permutation not used to draw it) is inside, a gradient divided
    twice (as by a mean over 2 ranks taken twice) is outside, named at step 0, by its gradient norm."""
    ref, twins = reference
    noise = bare_reference(permutation=TWINS)
    assert_parity(reference, noise, "one process, permuted")
    bug = bare_reference(grad_divisor=2.0)
    v = parity.verdict(ref[1], [t[1] for t in twins], bug[1], "one process", "gradient / 2", quantity="gradient norm")
    assert not v.agree and v.first_step == 0, str(v)
    assert "gradient / 2 leaves one process's band at step 0: gradient norm" in str(v)


PLANS2 = [
    Plan(dp=2),
    Plan(dp=2, accumulation=2),
    Plan(dp=2, accumulation=2, dp_variant="ddp"),
    Plan(dp=2, activation_checkpointing=True),
    Plan(tp=2),
    Plan(pp=2, pp_microbatches=2),
    Plan(pp=2, pp_microbatches=2, accumulation=2, schedule="gpipe"),
    Plan(dp=2, accumulation=2, loss_scaling=True),
]  # fp16's loss scaling, GPU-free: exact in fp32
PLANS4 = [
    Plan(dp=2, tp=2),
    Plan(dp=2, pp=2, pp_microbatches=2, accumulation=2, loss_scaling=True),
    Plan(tp=2, pp=2, pp_microbatches=2),
    Plan(dp=2, pp=2, pp_microbatches=2, zero_stage=1),
    Plan(
        dp=2, pp=2, pp_microbatches=2, zero_stage=2
    ),  # TP inside each pipeline stage, the tied head summed over stages
    Plan(dp=2, tp=2, zero_stage=1),
    Plan(dp=2, tp=2, zero_stage=2),
]  # ZeRO over each TP rank's DP group


@pytest.mark.parametrize("world, plans", [(2, PLANS2), (4, PLANS4)], ids=["2 ranks", "4 ranks"])
def test_every_plan_equals_one_process(request, reference, world, plans):
    cluster = request.getfixturevalue(f"cluster{world}")
    for plan in plans:
        outs = cluster.call(run_plan, (plan,), timeout=120)
        for rank, out in enumerate(outs):
            assert_parity(reference, out, f"{plan.label}, rank {rank}")


def test_bf16_autocast_stays_close(cluster2, reference):
    """bf16 autocast (CPU): the same run to bf16's precision (8 bits of mantissa: ~1e-2 on a loss of ~7)."""
    outs = cluster2.call(run_plan, (Plan(dp=2, mixed_precision="bf16"),), timeout=120)
    torch.testing.assert_close(outs[0][0], reference[0][0], rtol=0, atol=5e-2)


def test_tensor_parallel_bf16_autocast_stays_close(cluster2, reference):
    """TP and TP + SP under bf16 autocast (the split layers' backward takes a bf16 dL/dy beside fp32 weights).
    Measured: losses within 1e-4 of fp32's."""
    for plan in (Plan(tp=2, mixed_precision="bf16"), Plan(tp=2, sequence_parallel=True, mixed_precision="bf16")):
        losses = cluster2.call(run_plan, (plan,), timeout=120)[0][0]
        torch.testing.assert_close(losses, reference[0][0], rtol=0, atol=1e-2, msg=plan.label)


def test_zero3_bf16_policy_stays_close_to_bf16_autocast(cluster2, reference):
    """Plan(zero_stage=3, mixed_precision="bf16"): FSDP2's policy (bf16 weights gathered, fp32 reduce, fp32
    shards): the same run as bf16 autocast without ZeRO-3, to bf16's precision (and as close to fp32)."""
    runs = {
        p.label: cluster2.call(run_plan, (p,), timeout=120)[0]
        for p in (Plan(dp=2, mixed_precision="bf16"), Plan(dp=2, mixed_precision="bf16", zero_stage=3))
    }
    (losses, norms, ev), (z_losses, z_norms, z_ev) = runs["dp2 bf16"], runs["dp2 bf16 zero3"]
    # autocast already runs the matmuls on bf16 copies of the weights: what differs is the bf16 LayerNorm gains,
    # embeddings and block inputs. Measured: losses 5e-5 apart, gradient norms 4e-4 relative, eval loss 2e-4
    torch.testing.assert_close(z_losses, losses, rtol=0, atol=1e-3)
    torch.testing.assert_close(z_norms, norms, rtol=5e-3, atol=0)
    torch.testing.assert_close(z_ev, ev, rtol=0, atol=1e-3)
    torch.testing.assert_close(z_losses, reference[0][0], rtol=0, atol=5e-2)


@pytest.mark.parametrize(
    "plan, world, words",
    [
        (Plan(dp=3), 2, "needs 3 ranks"),
        (Plan(tp=3), 3, "does not divide the model's 4 attention heads"),
        (Plan(pp=3), 3, "use pp <= 2"),
        (Plan(dp=2, accumulation=3), 2, "does not split into dp=2 ranks x 3 accumulation steps"),
        (Plan(dp=1, tp=2, zero_stage=3), 2, "ZeRO-3 here gathers whole blocks.*zero_stage=1 or 2 with tp > 1"),
        (Plan(pp=2, pp_microbatches=3), 2, "x 3 pipeline micro-batches"),
        (Plan(pp=2, zero_stage=3), 2, "refused \\(as DeepSpeed does\\).*zero_stage=1 or 2 with pp > 1"),
    ],
)
def test_bad_plans_say_what_would_work(plan, world, words):
    with pytest.raises(ValueError, match=words):
        plan.validate(world, _task())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(dp=0), "Plan.dp must be an int >= 1"),
        (dict(dp_variant="allreduce"), "use one of"),
        (dict(schedule="zb"), "use one of"),
        (dict(mixed_precision="fp8"), "use one of"),
        (dict(checkpoint_every=5), "needs a checkpoint_dir"),
    ],
)
def test_bad_plan_fields(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Plan(**kwargs)


def test_regression_task_cannot_be_tensor_parallel():
    from simlib.tasks import RegressionTask

    with pytest.raises(ValueError, match="no tensor_parallel"):
        Plan(tp=2).validate(2, RegressionTask())


class _FailingTask:
    """The MLP regression task, except that rank 1 cannot read its batch at step 2."""

    def __new__(cls):
        from simlib.tasks import RegressionTask

        class Failing(RegressionTask):
            def batch(self, step):
                import torch.distributed as dist

                if step == 2 and dist.get_rank() == 1:
                    raise OSError("rank 1 lost its data shard at step 2")
                return super().batch(step)

        return Failing()


def _train_failing():
    from simlib.train import train

    return train(_FailingTask(), Plan(dp=2), steps=5, verbose=False, measure_memory=False).summary["steps"]


def test_a_failing_rank_is_named(cluster2):
    import simlib

    with pytest.raises(simlib.WorkerError) as info:
        cluster2.call(_train_failing, timeout=60)
    text = str(info.value)
    assert "rank 1" in text and "lost its data shard at step 2" in text


def test_activation_checkpointing_recomputes_what_the_forward_runs():
    """A block list of new containers would be checkpointed and never called: nothing recomputed, no error."""
    import sys
    from pathlib import Path

    from simlib.parallel.recompute import checkpoint_blocks
    from simlib.tasks import RegressionTask

    task = RegressionTask()
    model = task.build_model()
    blocks = task.blocks(model)
    assert all(any(b is m for m in model.modules()) for b in blocks)
    calls = []
    for block in blocks:
        block[0].register_forward_hook(lambda *a: calls.append(1))
    checkpoint_blocks(blocks)
    x, y = task.batch(0)
    task.loss(model(x), y).backward()
    assert len(calls) > len(blocks)  # the forward, then recomputation in backward

    class StrayBlocks(RegressionTask):
        def blocks(self, model):
            from simlib.parallel.pipeline import blocks_of

            return blocks_of(model.net)  # new Sequentials the model never calls

    sys.path.insert(0, str(Path(__file__).parent))
    from device_guard import guarded

    from simlib.parallelize import parallelize
    from simlib.train import Plan

    plan = Plan(activation_checkpointing=True)
    bad = StrayBlocks()
    with guarded(world_size=1), pytest.raises(ValueError, match="not part of the model"):
        parallelize(bad.build_model(), plan.mesh.build(), plan, bad, "cpu")


def test_the_simulator_reads_the_same_plan():
    """sim.Strategy.from_plan: the trainer's plan priced as it runs, and refused where the trainer refuses it."""
    from simlib import sim

    s = sim.Strategy.from_plan(Plan(dp=2, accumulation=4, zero_stage=1, activation_checkpointing=True), 64)
    assert (s.dp, s.micro_batch, s.num_micro_batches, s.zero_stage, s.recompute, s.dtype) == (
        2,
        8,
        4,
        1,
        "full",
        "fp32",
    )
    s = sim.Strategy.from_plan(Plan(pp=2, pp_microbatches=4, schedule="gpipe"), 32)
    assert (s.pp, s.micro_batch, s.num_micro_batches, s.schedule) == (2, 8, 4, "gpipe")
    s = sim.Strategy.from_plan(Plan(dp=2, tp=2, zero_stage=1), 64)
    assert (s.dp, s.tp, s.zero_stage) == (2, 2, 1)
    with pytest.raises(ValueError, match="ZeRO-3 here gathers whole blocks"):
        sim.Strategy.from_plan(Plan(tp=2, zero_stage=3), 64)
    # a pipeline plan that accumulates: every micro-batch priced, one pipeline flush (and bubble) per pass
    s = sim.Strategy.from_plan(Plan(pp=2, accumulation=2), 64)
    assert (s.micro_batch, s.num_micro_batches, s.pipeline_flushes) == (16, 4, 2)


def test_3d_plan_equals_one_process_on_8_ranks(reference):
    """Megatron's 3D: dp=2 x tp=2 x pp=2 on 8 processes, one launch (slow on 2 cores: the sizes stay quick), and
    the same with ZeRO-1 (optimizer states sharded over each (tp, pp) position's DP group)."""
    import warnings

    import simlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        cluster = simlib.Cluster(8, timeout=60)
    try:
        for plan in (
            Plan(dp=2, tp=2, pp=2, pp_microbatches=2),
            Plan(dp=2, tp=2, pp=2, pp_microbatches=2, zero_stage=1),
        ):
            outs = cluster.call(run_plan, (plan,), timeout=300)
            for rank, out in enumerate(outs):
                assert_parity(reference, out, f"{plan.label}, rank {rank}")
    finally:
        cluster.close()


SP_PLANS = {
    2: [Plan(tp=2, sequence_parallel=True)],
    4: [
        Plan(dp=2, tp=2, sequence_parallel=True, accumulation=2),
        Plan(tp=2, pp=2, pp_microbatches=2, sequence_parallel=True),
    ],
}  # (B, S/tp, H) between the stages


@pytest.mark.parametrize("world", [2, 4], ids=["tp2 sp", "dp2 tp2 sp acc2, tp2 pp2 sp"])
def test_sequence_parallel_plans_equal_one_process(request, reference, world):
    """Plan(sequence_parallel=True): LayerNorms and residuals on S/tp of the sequence, the replicated weights'
    gradients summed over the TP group after the backward; the same run as one process."""
    cluster = request.getfixturevalue(f"cluster{world}")
    for plan in SP_PLANS[world]:
        for rank, out in enumerate(cluster.call(run_plan, (plan,), timeout=120)):
            assert_parity(reference, out, f"{plan.label}, rank {rank}")


@pytest.mark.parametrize(
    "plan, world, words",
    [
        (Plan(dp=2, sequence_parallel=True), 2, "but tp=1: use tp >= 2"),
        (Plan(tp=4, sequence_parallel=True), 4, "seq_len is 30: use tp in \\[2\\], or sequence_parallel=False"),
    ],
)
def test_bad_sequence_parallel_plans_are_refused(plan, world, words):
    from simlib.projects.gpt import GPTTask

    task = GPTTask.quick(seq_len=30, num_heads=4) if plan.tp == 4 else _task()
    with pytest.raises(ValueError, match=words):
        plan.validate(world, task)
