"""Memory per device by pipeline stage, the course GPT's whole head, and the CPU peak they are measured against.

``benchmarks/planner_measured.py --memory-only`` holds the planner's memory per rank to the measured peak of
every plan of the GPT project; these are the rules behind it, each against a hand count, and the measurement bug
that made pipelines with recomputation look larger than without it (torch's per-op memory roll-up lost frees)."""

import pytest

from simlib import sim
from simlib.sim import memory

# the GPT project's full size as the simulator sees it (simlib.dry_run.sim_model): fp32 on CPU, Adam
GPT = sim.gpt(4, 128, 4, seq_len=64, vocab=1024, name="GPT 4x128").__class__(
    **{**sim.gpt(4, 128, 4, seq_len=64, vocab=1024).__dict__, "dropout": False}
)


def _course(**kw):
    return sim.Strategy(dtype="fp32", optimizer="adam", head="whole", **kw)


def test_whole_head_places_the_vocabulary_on_the_end_stages_and_keeps_it_whole_under_tp():
    """16 bytes per fp32 Adam parameter; the blocks split over tp and the stages, V·h + s·h on the first stage, the
    tied head's copy (V·h) on the last, both whole on every tp rank (simlib/projects/gpt/model.py)."""
    V, h, s = 1024, 128, 64
    blocks = GPT.params - V * h - s * h
    st = _course(tp=2, pp=2, micro_batch=32)
    first, last = (memory.memory_per_device(GPT, st, stage=k) for k in (0, 1))
    assert first["weights"] == pytest.approx(4 * (blocks / 4 + V * h + s * h))
    assert last["weights"] == pytest.approx(4 * (blocks / 4 + V * h))
    mega = memory.memory_per_device(GPT, st.replace(head="parallel"), stage=0)
    assert mega["weights"] == pytest.approx(4 * GPT.params / 4)  # Megatron: everything split, spread evenly


def test_the_largest_stage_is_priced_for_the_course_and_the_first_for_megatron():
    """One micro-batch through 4 stages: the last holds the loss's three fp32 b·s·V copies and is the largest;
    ``stage=None`` takes it for the course's head, the first stage (as published runs are priced) for Megatron's."""
    st = _course(pp=4, micro_batch=32)
    stages = [memory.memory_per_device(GPT, st, stage=k)["total"] for k in range(4)]
    assert max(stages) == stages[3] > stages[0]
    assert memory.memory_per_device(GPT, st)["total"] == stages[3]
    logits = 4 * 32 * 64 * 1024
    assert stages[3] - stages[1] >= 3 * logits - memory.memory_per_device(GPT, st, stage=3)["gradients"]
    mega = st.replace(head="parallel")
    assert memory.memory_per_device(GPT, mega) == memory.memory_per_device(GPT, mega, stage=0)
    with pytest.raises(ValueError, match="stage must be an int in"):
        memory.memory_per_device(GPT, st, stage=4)


def test_in_flight_micro_batches_and_the_interleaved_factor_by_stage():
    """1F1B: stage k holds min(pp − k, m); GPipe all m; interleaving 1 + (p − 1 − 2k)/(p·v) (first stage as before)."""
    s = sim.Strategy(pp=4, num_micro_batches=8)
    assert [memory.in_flight_micro_batches(s, k) for k in range(4)] == [4, 3, 2, 1]
    assert [memory.in_flight_micro_batches(s.replace(schedule="gpipe"), k) for k in range(4)] == [8] * 4
    v = sim.Strategy(pp=4, num_micro_batches=8, schedule="interleaved", virtual_stages=2)
    assert memory.interleave_factor(v) == memory.interleave_factor(v, 0) == pytest.approx(1 + 3 / 8)
    assert memory.interleave_factor(v, 3) == pytest.approx(1 - 3 / 8)


def test_from_plan_and_the_planner_price_the_course_head():
    """The trainer's plans map to head="whole", and the planner's plans for a task round-trip through the trainer
    (a head the plan cannot say would have been refused as a missing knob)."""
    from simlib.plan import Plan
    from simlib.projects.gpt import GPTTask

    assert sim.Strategy.from_plan(Plan(tp=2, dp=2), 32).head == "whole"
    task = GPTTask.quick()
    res = sim.plan(
        sim_model(task),
        "cpu",
        devices=2,
        global_batch=task.global_batch,
        task=task,
        trainer_only=True,
        space=dict(zero_stage=(0,), recompute=("none",), num_micro_batches=(1,)),
    )
    assert res.ranked and all(e["strategy"].head == "whole" for e in res.ranked)


def sim_model(task):
    from simlib.dry_run import sim_model as f

    return f(task)


def _peaks(task, plan):
    from simlib.train import train

    record = train(task, plan, steps=2, log_every=2, warmup=1, verbose=False)
    return record.summary["peak_memory_by_rank"]


def test_recomputation_lowers_the_measured_peak_of_a_pipeline(cluster2):
    """Two stages, four micro-batches: checkpointing each block must lower every rank's measured CPU peak. The
    per-op roll-up (``self_cpu_memory_usage``) lost the frees of the checkpointed forward's temporaries here and
    measured it higher than without recomputation; the allocation records themselves do not."""
    from simlib.plan import Plan
    from simlib.projects.gpt import GPTTask

    task = GPTTask.quick(global_batch=32)
    plain = cluster2.call(_peaks, (task, Plan(pp=2, pp_microbatches=4)))[0]
    ckpt = cluster2.call(_peaks, (task, Plan(pp=2, pp_microbatches=4, activation_checkpointing=True)))[0]
    assert all(c < p for c, p in zip(ckpt, plain)), (ckpt, plain)


def test_allocation_trace_balances():
    """Every allocation a finished function freed has its free in the trace: the sum of what it kept is zero."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from simlib.parallel.accumulate import allocation_trace, peak_memory

    def fn():
        a = torch.ones(256, 256)
        b = a @ a
        del a, b

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    trace = allocation_trace(prof)
    assert trace and sum(d for _, d, _ in trace) == 0
    assert peak_memory(fn) == 2 * 256 * 256 * 4


def test_train_counting_state_adds_the_static_bytes(cluster2):
    """The measured memory per rank the planner is held to: each rank's parameters (4 bytes each here) and Adam's
    two states (twice that, and a 4-byte step count per parameter tensor), beside the step's peak above its start."""
    from simlib.debug.memory import measured_memory, train_counting_state
    from simlib.plan import Plan
    from simlib.projects.gpt import GPTTask
    from simlib.projects.runner import train_on

    task = GPTTask.quick()
    record, _ = train_on(
        2,
        task,
        Plan(dp=2),
        cluster=cluster2,
        steps=2,
        log_every=2,
        warmup=1,
        verbose=False,
        train_fn=train_counting_state,
    )
    ranks = record.summary["memory_ranks"]
    model = task.build_model()
    params, tensors = 4 * model.cfg.num_parameters(), len(list(model.parameters()))
    assert [r["params"] for r in ranks] == [params] * 2
    assert [r["optimizer"] for r in ranks] == [2 * params + 4 * tensors] * 2
    assert [r["grads"] for r in ranks] == [params] * 2  # the last step's, freed as the measured step starts
    assert measured_memory(ranks) == max(r["params"] + r["optimizer"] + r["grads"] + r["step_peak"] for r in ranks)


def test_a_free_on_another_thread_counts():
    """A block whose last reference another thread drops (as Gloo's worker does with a collective's tensor) is
    freed: the next block of the same size must not raise the peak. The profiler records no free on a thread it
    does not profile; the allocator's count of every thread (``count_every_thread``) sees it."""
    import threading

    import torch

    from simlib.parallel.accumulate import count_every_thread, peak_memory

    nbytes = 1 << 20

    def fn():
        box = [torch.ones(nbytes // 4)]
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        return torch.ones(nbytes // 4)

    if not count_every_thread():
        pytest.skip("this torch build has no FLAGS_caffe2_report_cpu_memory_usage in libc10")
    assert peak_memory(fn) == nbytes
