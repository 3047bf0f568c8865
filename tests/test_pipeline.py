"""Pipeline schedules (pure data) and the executor, checked against a single-process reference."""

import pytest
import torch

from simlib.parallel import schedules as S


# ── schedules: no communication needed ──
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_schedules_complete_and_deadlock_free(p, m):
    for schedule in (S.gpipe(p, m), S.one_f_one_b(p, m)):
        S.check(schedule)
        assert len(schedule) == p
    if m % p == 0:
        for v in (1, 2, 3):
            S.check(S.interleaved_1f1b(p, m, v))


def test_1f1b_order_and_memory():
    s = S.one_f_one_b(4, 8)
    assert S.format_schedule(s).splitlines()[0] == "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert S.format_schedule(s).splitlines()[3] == "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    assert S.peak_activations(s) == [4, 3, 2, 1]
    assert S.peak_activations(S.gpipe(4, 8)) == [8, 8, 8, 8]
    assert s[1][:3] == [S.Action("recv_forward", 0), S.Action("forward", 0), S.Action("send_forward", 0)]


def test_interleaved_equals_1f1b_with_one_chunk():
    assert S.interleaved_1f1b(4, 8, 1) == S.one_f_one_b(4, 8)


def test_check_catches_broken_schedules():
    s = S.one_f_one_b(2, 2)
    with pytest.raises(ValueError, match="incomplete"):
        S.check([s[0][:-1], s[1]])
    # last rank receives its gradient before it was sent: rank 0 waits for rank 1's backward first
    bad = [list(s[0]), list(s[1])]
    bad[1] = [a for a in bad[1] if a.op != "send_backward"] + [a for a in bad[1] if a.op == "send_backward"]
    bad[0] = bad[0]  # still valid: sends are async, so moving sends later cannot deadlock
    S.check(bad)
    swapped = [list(reversed(S.compute_order(s[0]))), s[1]]
    with pytest.raises(ValueError):
        S.check(swapped)
    # both ranks wait for each other: rank 0 receives a gradient before sending its activation
    deadlock = [[S.Action("recv_backward", 0)] + [a for a in s[0] if a.op != "recv_backward" or a.microbatch], s[1]]
    with pytest.raises(ValueError, match="before its forward|deadlock"):
        S.check(deadlock)


def test_bubble_formula():
    assert S.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert S.bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    assert S.bubble_fraction(1, 5) == 0


# ── executor: real send/recv, compared with one process ──
def _pipeline_grads(schedule_name, num_microbatches, num_chunks=1, width=16, depth=7, batch=8, seed=0):
    import torch
    import torch.distributed as dist

    from simlib.models import MLP, make_regression
    from simlib.parallel import pipeline, schedules
    from simlib.timeline import Timeline

    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = MLP(width=width, depth=depth, in_features=8, out_features=2)
    x, y = make_regression(batch, 8, 2, seed=seed)
    stages = pipeline.build_stages(model.net, rank, world_size, num_chunks)
    if schedule_name == "interleaved_1f1b":
        schedule = schedules.interleaved_1f1b(world_size, num_microbatches, num_chunks)
    else:
        schedule = schedules.SCHEDULES[schedule_name](world_size, num_microbatches)
    tl = Timeline()
    with tl.step(0):
        out = pipeline.pipeline_step(
            schedule, stages, x, y, num_microbatches=num_microbatches, activation_width=width, timeline=tl
        )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    df = tl.gather()
    return dict(
        grads=grads,
        loss=out["loss"],
        peak=out["peak_in_flight"],
        bytes=out["peak_activation_bytes"],
        kinds=sorted(set(df["kind"])),
        ranks=sorted(set(df["rank"])),
    )


def _reference(width=16, depth=7, batch=8, seed=0):
    from simlib.models import MLP, make_regression

    torch.manual_seed(seed)
    model = MLP(width=width, depth=depth, in_features=8, out_features=2)
    x, y = make_regression(batch, 8, 2, seed=seed)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _assert_matches_reference(results, world_size):
    ref_loss, ref_grads = _reference()
    merged = {}
    for r in results:
        assert not (merged.keys() & r["grads"].keys()), "a parameter lives on two stages"
        merged.update(r["grads"])
    assert merged.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(merged[name], ref_grads[name], rtol=1e-5, atol=1e-6)
    assert results[-1]["loss"] == pytest.approx(ref_loss, rel=1e-5)
    assert results[0]["ranks"] == list(range(world_size))


@pytest.mark.parametrize("name,m", [("naive", 1), ("gpipe", 4), ("1f1b", 4)])
def test_executor_2_ranks(cluster2, name, m):
    results = cluster2.call(_pipeline_grads, (name, m), timeout=60)
    _assert_matches_reference(results, 2)
    assert {"forward", "backward", "wait", "comm"} <= set(results[0]["kinds"])
    if name == "1f1b":
        assert [r["peak"] for r in results] == [2, 1]
    if name == "gpipe":
        assert [r["peak"] for r in results] == [4, 4]
        assert results[0]["bytes"] > 0


def test_executor_interleaved_2_ranks(cluster2):
    results = cluster2.call(_pipeline_grads, ("interleaved_1f1b", 4, 2), timeout=60)
    _assert_matches_reference(results, 2)


@pytest.mark.parametrize("name,m", [("gpipe", 4), ("1f1b", 8)])
def test_executor_4_ranks(cluster4, name, m):
    results = cluster4.call(_pipeline_grads, (name, m), timeout=90)
    _assert_matches_reference(results, 4)
    if name == "1f1b":
        assert [r["peak"] for r in results] == [4, 3, 2, 1]


def test_executor_interleaved_4_ranks(cluster4):
    results = cluster4.call(_pipeline_grads, ("interleaved_1f1b", 4, 2), timeout=90)
    _assert_matches_reference(results, 4)


def test_build_stages_splits_evenly():
    from simlib.models import MLP
    from simlib.parallel.pipeline import blocks_of, build_stages, split_blocks

    model = MLP(width=8, depth=4, in_features=8, out_features=1)
    assert len(blocks_of(model.net)) == 5  # 4 x (Linear, ReLU) + the head
    assert [len(r) for r in split_blocks(5, 2)] == [2, 3]
    stages = [build_stages(model.net, r, 2)[0] for r in range(2)]
    assert sum(len(s) for s in stages) == 5
    with pytest.raises(ValueError):
        split_blocks(3, 4)
