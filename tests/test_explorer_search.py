"""Lesson 13's explorer searches through simlib.sim.fast_search: a pricer kept per model and machine, each setting
searched once, the next moves searched ahead in the background. None of it may change a plan or a number: every
result here is compared with a fresh ``sim.plan`` (the bounded search and the exhaustive one) on several models and
clusters, in an order that makes the kept pricer and its memos serve later searches."""

import time

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from simlib import sim  # noqa: E402
from simlib.sim import fast_search  # noqa: E402

# a narrow space keeps each search under a second here (every degree, ZeRO 1 and 3, recomputation or not,
# interleaving or not); one setting below also runs a wider one, LESSON_SPACE: lesson 13's quick-mode space but
# with micro-batches of up to 2 (the lesson's quick mode searches 1; this keeps 2 covered here)
SPACE = dict(
    zero_stage=(1, 3),
    recompute=("none", "full"),
    fsdp=(False,),
    schedule=("1f1b", "interleaved"),
    tp_overlap=(False,),
    max_micro_batch=1,
    max_virtual_stages=2,
    cp_kind=("ring",),
)
LESSON_SPACE = dict(recompute=("none", "full"), tp_overlap=(False,), max_micro_batch=2, max_virtual_stages=4)
# (model, cluster, nodes, global batch, sequence, GB limit): moves of one control at a time, then other pairs
SETTINGS = [
    ("8B", "h100", 1, 64, 4096, 72),
    ("8B", "h100", 2, 64, 4096, 72),  # nodes: the same pricer, other worlds
    ("8B", "h100", 2, 128, 4096, 72),  # batch
    ("8B", "h100", 2, 128, 4096, 24),  # memory limit: plans over it now, memory from the memo
    ("8B", "h100", 2, 128, 4096, 72),  # and back: every price from the memo
    ("70B", "a100", 2, 64, 2048, 40),
    ("llama2-7b", "h200", 1, 64, 4096, 60),
]


def _same(a, b, k=10):
    """The same ranked plans, numbers and memory, and the same account of the search."""
    assert [e["strategy"] for e in a.ranked[:k]] == [e["strategy"] for e in b.ranked[:k]]
    for x, y in zip(a.ranked[:k], b.ranked[:k]):
        assert {n: v for n, v in x.items() if n != "memory"} == {n: v for n, v in y.items() if n != "memory"}
        assert x["memory"] == y["memory"]
    assert a.memory_limit == b.memory_limit and a.world_size == b.world_size and a.exact == b.exact


def _fresh(setting, top=10, space=SPACE):
    model, cluster, nodes, batch, seq, gb = setting
    return sim.plan(
        model, cluster, nodes=nodes, global_batch=batch, seq_len=seq, memory_limit=gb * 1e9, space=space, top=top
    )


def test_kept_pricer_gives_the_plans_and_numbers_of_a_fresh_search():
    searches = fast_search.Searches()
    for i, setting in enumerate(SETTINGS):
        got = searches.get(*setting, space=SPACE)
        bounded = _fresh(setting)
        _same(got, bounded)
        assert got.ranked or got.too_big  # (where nothing fits, the smallest plans are the same too)
        if i == 3:  # the bounded search's first 10 are the exhaustive search's (tests/test_planner.py: many more)
            _same(got, _fresh(setting, top=None))
        assert (got.considered, got.pruned, got.extra["priced"], got.refused) == (
            bounded.considered,
            bounded.pruned,
            bounded.extra["priced"],
            bounded.refused,
        )
        assert [r["strategy"] for r in got.too_big] == [r["strategy"] for r in bounded.too_big]
        assert not got.notes, got.notes  # plan()'s own check against sim.predict held (no fallback)
    assert len(searches.pricers) == 3  # one per model and machine, kept across the moves
    _same(searches.get(*SETTINGS[1], space=LESSON_SPACE), _fresh(SETTINGS[1], space=LESSON_SPACE))
    t0 = time.perf_counter()
    assert searches.get(*SETTINGS[0], space=SPACE) is searches.get(*SETTINGS[0], space=SPACE)
    assert time.perf_counter() - t0 < 0.1  # a setting seen before is not searched again


def test_a_background_search_stopped_by_a_redraw_is_resumed_and_right():
    searches = fast_search.Searches()
    ahead = [s + (SPACE, 10) for s in SETTINGS[:3]]
    searches.prefetch(ahead)
    time.sleep(fast_search._SETTLE + 0.2)  # the background has begun the first
    now = searches.get(*SETTINGS[5], space=SPACE)  # a redraw elsewhere: the background stops for it
    _same(now, _fresh(SETTINGS[5]))
    searches.prefetch(ahead)  # the redraw queues the next moves again
    assert searches.wait(300), "the background searches did not finish"
    for setting in SETTINGS[:3]:
        key = fast_search._setting_key(*setting, SPACE, 10)
        assert key in searches.results, f"{setting} was not searched ahead"
        _same(searches.results[key], _fresh(setting))


def test_the_explorer_redraws_a_prefetched_move_without_searching(monkeypatch):
    pytest.importorskip("ipywidgets")
    from simlib import widgets
    from simlib.sim import planner

    monkeypatch.setattr(fast_search, "SEARCHES", fast_search.Searches())
    box = widgets.planner_explorer(space=SPACE)
    assert box.redraw.out.outputs, box.redraw.status.value
    controls = {c.description: c for c in box.children[0].children}
    key = fast_search._setting_key("70B", "h100", 8, 256, 8192, 72, SPACE, 10)
    deadline = time.monotonic() + 300
    while key not in box.searches.results and time.monotonic() < deadline:  # the first move queued: nodes + 1
        time.sleep(0.2)
    box.searches.cancel()  # the rest of the queue (other moves) is not needed here
    calls = []
    real = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **k: calls.append(a) or real(*a, **k))
    controls["nodes"].value = 8  # one step up from 4: searched ahead
    assert calls == [] and box.redraw.out.outputs and "best:" in box.redraw.status.value
    _same(box.searches.results[key], _fresh(("70B", "h100", 8, 256, 8192, 72)))
