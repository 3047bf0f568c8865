"""The hang finder (simlib.debug.hangs): planted hangs on 2, 3 and 4 ranks name the rank and the call site."""

import re
import warnings

import pytest

import simlib
from simlib.debug import hangs


def _line(fn, marker):
    """The line number of the line holding ``marker`` in ``fn``'s source (so the test does not hard-code it)."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


# ── the planted hangs (module level: they travel by reference, so call sites name this file) ──


def skip_on_rank1():
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        return "skipped"  # rank 1 leaves before the second all_reduce
    dist.all_reduce(t)  # PLANTED-SKIP
    return "done"


def busy_in_a_loop():
    import torch
    import torch.distributed as dist

    t = torch.ones(16)
    dist.all_reduce(t)  # PLANTED-LAST
    if dist.get_rank() == 1:
        stuck()  # rank 1 never reaches the second all_reduce: it is busy, not in a collective
    dist.all_reduce(t)
    return "done"


def stuck():
    n = 0
    while n >= 0: n += 1  # noqa: E701  PLANTED-STUCK (one line: the signal lands on it whatever bytecode runs)  # fmt: skip


def wrong_op_on_rank2():
    import torch
    import torch.distributed as dist

    t = torch.ones(64)
    dist.all_reduce(t)
    if dist.get_rank() == 2:
        dist.broadcast(t, src=0)  # PLANTED-BROADCAST
    else:
        dist.all_reduce(t)  # PLANTED-ALLREDUCE
    return "done"


def subgroup_shape_on_rank3():
    import torch
    import torch.distributed as dist

    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    rank = dist.get_rank()
    mine = odds if rank % 2 else evens
    t = torch.ones(256 if rank != 3 else 128)  # rank 3's bucket has another size
    dist.all_reduce(t, group=mine)  # PLANTED-SHAPE
    dist.barrier()
    return "done"


def _cluster(n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", simlib.OversubscribedWarning)
        return simlib.Cluster(n, timeout=3)


def _planted(n, fn):
    cluster = _cluster(n)
    try:
        with pytest.raises(simlib.WorkerError) as info:
            cluster.call(fn, timeout=60)
        return str(info.value)
    finally:
        cluster.close()


def _planted_many(n, fns):
    cluster = _cluster(n)
    texts = []
    try:
        for fn in fns:  # after each failure the cluster starts fresh workers for the next call
            with pytest.raises(simlib.WorkerError) as info:
                cluster.call(fn, timeout=60)
            texts.append(str(info.value))
        return texts
    finally:
        cluster.close()


def test_two_ranks_rank_that_skipped_a_collective_and_buckets_out_of_order():
    text, buckets, busy = _planted_many(2, [skip_on_rank1, buckets_in_another_order, busy_in_a_loop])
    line = _line(skip_on_rank1, "PLANTED-SKIP")
    assert "WorkerTimeout" in text or "timed out" in text.lower() or "timeout" in text.lower()
    assert (
        f"rank 0 called all_reduce(shape [1024], float32) at test_hangs.py:{line} in skip_on_rank1; "
        "rank 1 never called it"
    ) in text, text
    assert "Rank(s) [1] behind" in text and "returned from the function" in text
    # Gloo aborts on the size mismatch (a rank dies): not a timeout, and the finder still names the two buckets
    line = _line(buckets_in_another_order, "PLANTED-BUCKETS")
    assert "call #0 on group WORLD" in buckets, buckets
    assert f"rank 0 is in all_reduce(shape [4], float32) at test_hangs.py:{line}" in buckets
    assert f"rank 1 is in all_reduce(shape [6], float32) at test_hangs.py:{line}" in buckets
    # a rank busy in a Python loop: named with its last collective *and* where its stack is now (SIGUSR2 dump)
    last, now = _line(busy_in_a_loop, "PLANTED-LAST"), _line(stuck, "PLANTED-STUCK")
    assert (
        f"rank 1 never called it (its last there was all_reduce(shape [16], float32) at test_hangs.py:{last} "
        f"in busy_in_a_loop; then it was still running at test_hangs.py:{now} in stuck (stopped))"
    ) in busy, busy


def test_three_ranks_a_rank_in_another_collective():
    text = _planted(3, wrong_op_on_rank2)
    b, a = _line(wrong_op_on_rank2, "PLANTED-BROADCAST"), _line(wrong_op_on_rank2, "PLANTED-ALLREDUCE")
    assert "call #1 on group WORLD" in text, text
    assert f"ranks 0,1 are in all_reduce(shape [64], float32) at test_hangs.py:{a} in wrong_op_on_rank2" in text
    assert f"rank 2 is in broadcast(shape [64], float32, src 0) at test_hangs.py:{b} in wrong_op_on_rank2" in text


def test_four_ranks_shape_differs_in_a_subgroup():
    text = _planted(4, subgroup_shape_on_rank3)
    line = _line(subgroup_shape_on_rank3, "PLANTED-SHAPE")
    assert "on group ranks 1,3" in text, text
    assert f"rank 1 is in all_reduce(shape [256], float32) at test_hangs.py:{line}" in text
    assert f"rank 3 is in all_reduce(shape [128], float32) at test_hangs.py:{line}" in text


def test_history_and_check_on_a_warm_cluster(cluster2):
    """In-process: the history of a call, and ``check`` raising (without a hang) when the sequences differ."""

    def ok():
        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.ones(3))
        dist.broadcast(torch.ones(2, dtype=torch.float64), src=1)
        hangs.check()
        return [(r["op"], r["shape"], r["dtype"], r.get("src")) for r in hangs.history()]

    for h in cluster2.run(ok):  # the check's own all_gather_object stays out of the history
        assert h == [("all_reduce", "[3]", "float32", None), ("broadcast", "[2]", "float64", 1)]


def buckets_in_another_order():
    import torch
    import torch.distributed as dist

    first, second = torch.ones(4), torch.ones(6)
    order = [first, second] if dist.get_rank() == 0 else [second, first]  # rank 1 reduces its buckets reversed
    for bucket in order:
        dist.all_reduce(bucket, async_op=True).wait()  # PLANTED-BUCKETS
    return "done"


def _rec(op, seq, shape=(8,), group="WORLD", **extra):
    return {
        "op": op,
        "group": group,
        "seq": seq,
        "shape": str(list(shape)),
        "dtype": "float32",
        "site": f"/x/train.py:{10 + seq}:step",
        "t": float(seq),
        **extra,
    }


def test_diagnose_send_recv_pairs_and_agreement():
    """Without processes: point-to-point pairs, and sequences that agree (a rank simply slower)."""
    logs = {0: [_rec("send", 0, dst=1)], 1: [_rec("recv", 0, src=0), _rec("recv", 1, src=0)]}
    d = hangs.first_divergence(logs, 2)
    assert d["group"] == "send/recv 0->1" and d["seq"] == 1 and d["behind"] == [0]
    text = hangs.diagnose(logs, 2, {0: "returned from the function"})
    assert "rank 1 called recv(shape [8], float32, src 0) at train.py:11 in step; rank 0 never called it" in text
    same = {0: [_rec("all_reduce", 0)], 1: [_rec("all_reduce", 0)]}
    assert hangs.first_divergence(same, 2) is None
    assert "agree as far as each got" in hangs.diagnose(same, 2)
    assert re.search(r"rank 1: last collective #0: all_reduce", hangs.diagnose(same, 2))


def test_a_subgroup_mismatch_is_the_cause_even_when_the_barrier_after_it_came_first_on_the_clock():
    """Ranks 0 and 2 reach the WORLD barrier before ranks 1 and 3 start their subgroup all_reduce (slow start-up):
    the barrier's divergence is a consequence of ranks 1 and 3 being stuck, so the finder names the subgroup."""

    def rec(op, shape, group, t):
        return {"op": op, "shape": shape, "dtype": "float32", "group": group, "t": t, "site": "x.py:1:f"}

    logs = {
        0: [rec("all_reduce", "[256]", "ranks 0,2", 1.0), rec("barrier", "[]", "WORLD", 2.0)],
        2: [rec("all_reduce", "[256]", "ranks 0,2", 1.0), rec("barrier", "[]", "WORLD", 2.0)],
        1: [rec("all_reduce", "[256]", "ranks 1,3", 3.0)],
        3: [rec("all_reduce", "[128]", "ranks 1,3", 3.5)],
    }
    d = hangs.first_divergence(logs, 4)
    assert d["group"] == "ranks 1,3" and not d["behind"], d
    text = hangs.diagnose(logs, 4)
    assert "on group ranks 1,3" in text and "rank 3 is in all_reduce(shape [128]" in text, text


def test_where_picks_the_main_threads_innermost_frame_of_the_learners_code():
    """Without processes: a faulthandler dump with two threads; the header names the main thread, and the frames of
    torch and the standard library inside the learner's call are skipped."""
    import os
    import threading

    import torch

    torch_file = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
    stdlib_file = threading.__file__
    dump = (
        "simlib main thread 0x00007f0000000001\n"
        "Thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{stdlib_file}", line 320 in wait\n'
        '  File "/work/other.py", line 3 in relay\n\n'
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        f'  File "{torch_file}", line 2500 in all_reduce\n'
        '  File "/work/hang.py", line 8 in stuck\n'
        '  File "/work/hang.py", line 5 in main\n'
    )
    from simlib.debug import stacks

    assert stacks.where(dump) == "/work/hang.py:8:stuck"
    other = dump.replace("simlib main thread 0x00007f0000000001", "simlib main thread 0x00007f0000000002")
    assert stacks.where(other) == "/work/other.py:3:relay"  # the header decides, not "Current thread"
    assert stacks.where("") is None
