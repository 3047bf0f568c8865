"""The planner's search for an explorer: the same plans and numbers as :func:`simlib.sim.plan`, sooner on a redraw.

Lesson 13's explorer (:func:`simlib.widgets.planner_explorer`) searches again each time a learner moves a control.
Three things make a redraw cheap without changing what it shows:

- **One pricer per model and machine, kept.** :class:`SharedPricer` is :class:`~simlib.sim.planner_cost.FastPricer`
  (whose caches are keyed on every strategy field each part reads, never on the world size, the batch or the memory
  limit) with two more memos: a strategy's memory per device and its price at a global batch. Moving the nodes,
  the batch or the memory limit reuses every stage, sync and operator priced before; moving the memory limit back
  and forth reprices nothing.
- **Each setting searched once** (:meth:`Searches.get`): a setting seen before is redrawn from its result.
- **The next move searched ahead** (:meth:`Searches.prefetch`): while the learner reads a figure, a background thread
  searches the settings one step away on each slider. A redraw that wants the CPU stops it at once (the next plan
  it looks at raises :class:`Stopped`; what it priced stays in the memos); the redraw queues the next moves after.

Each search is ``sim.plan(..., top=k, pricer=shared)`` itself: the enumeration, the validation, the bound, the
ranking and ``plan``'s own check of its top plans against ``sim.predict`` are the planner's, unchanged
(``tests/test_explorer_search.py`` compares the results with a fresh ``sim.plan`` on several models and clusters).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from .planner_cost import FastPricer

_SETTLE = 0.3  # seconds a prefetch waits before it starts (the redraw's figure reaches the page first)
_MEMO_LIMIT = 400_000  # strategies remembered per pricer (memory and price): about 0.5 GB at most, then forgotten


class Stopped(Exception):
    """A background search was stopped because a redraw wants the CPU."""


class SharedPricer(FastPricer):
    """A :class:`FastPricer` kept across searches of one model on one machine, with memory and prices memoized per
    strategy (a :class:`~simlib.sim.Strategy` is the whole key: nothing is assumed about which fields they read)."""

    def __init__(self, model, hardware):
        super().__init__(model, hardware)
        self._memory: dict = {}
        self._prices: dict = {}
        self.stop = None  # a threading.Event: set, the next bound or memory raises Stopped (background searches only)

    def _check_stop(self):
        if self.stop is not None and self.stop.is_set():
            raise Stopped()

    def floor(self, s, tp_overlap: bool = False, **changes) -> float:
        self._check_stop()  # the search's first pass bounds every layout before it prices one
        return super().floor(s, tp_overlap, **changes)

    def bound(self, s, variants) -> float:
        self._check_stop()
        return super().bound(s, variants)

    def memory(self, s) -> dict:
        self._check_stop()
        out = self._memory.get(s)
        if out is None:
            if len(self._memory) > _MEMO_LIMIT:
                self._memory.clear()
            out = self._memory[s] = super().memory(s)
        return dict(out)

    def price(self, s, global_batch: int) -> dict:
        key = (s, global_batch)
        out = self._prices.get(key)
        if out is None:
            if len(self._prices) > _MEMO_LIMIT:
                self._prices.clear()
            out = self._prices[key] = super().price(s, global_batch)
        return dict(out)


def _setting_key(model, cluster, nodes, global_batch, seq_len, memory_gb, space, top):
    return (model, cluster, nodes, global_batch, seq_len, memory_gb, repr(space), top)


class Searches:
    """The searches of one explorer (or of a whole session): results by setting, pricers by model and machine."""

    def __init__(self):
        self.results: dict = {}
        self.pricers: dict = {}
        self._lock = threading.RLock()  # one search at a time (the pricers' caches are not shared between threads)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: list = []

    def _pricer(self, model, cluster, seq_len):
        from .plan_result import resolve_hardware, resolve_model

        m, hw = resolve_model(model, seq_len), resolve_hardware(cluster)
        key = (repr(m), repr(hw))
        if key not in self.pricers:
            self.pricers[key] = SharedPricer(m, hw)
        return self.pricers[key]

    def _search(self, setting, stop=None):
        from .planner import plan

        model, cluster, nodes, global_batch, seq_len, memory_gb, space, top = setting
        pricer = self._pricer(model, cluster, seq_len)
        pricer.stop = stop
        try:
            return plan(
                model,
                cluster,
                nodes=nodes,
                global_batch=global_batch,
                seq_len=seq_len,
                memory_limit=None if memory_gb is None else memory_gb * 1e9,
                space=space,
                top=top,
                pricer=pricer,
            )
        finally:
            pricer.stop = None

    @contextmanager
    def paused(self):
        """Inside: no background search runs (a redraw's search and figure have the CPU and the GIL to
        themselves); one under way stops at its next plan, and the next :meth:`prefetch` resumes the queue."""
        self._stop.set()
        with self._lock:
            self._stop.clear()
            yield

    def get(self, model, cluster, nodes, global_batch, seq_len, memory_gb, space=None, top: int = 10):
        """The result of ``sim.plan(model, cluster, nodes=..., ..., top=top)`` for this setting: found before, or
        searched now (a background search is stopped first)."""
        setting = (model, cluster, nodes, global_batch, seq_len, memory_gb, space, top)
        key = _setting_key(*setting)
        if key in self.results:
            return self.results[key]
        with self.paused():
            if key not in self.results:  # (the background may just have finished it)
                self.results[key] = self._search(setting)
        return self.results[key]  # a stopped background search resumes at the next prefetch()

    def prefetch(self, settings):
        """Search ``settings`` (tuples of :meth:`get`'s arguments, in order) in a background thread, one at a time,
        each stopped whenever :meth:`get` wants the CPU; replaces what was queued before."""
        self._queue = [s for s in settings if _setting_key(*s) not in self.results]
        self._resume()

    def _resume(self):
        if self._queue and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._work, name="simlib-plan-prefetch", daemon=True)
            self._thread.start()

    def _work(self):
        time.sleep(_SETTLE)  # the redraw that queued this shows its figure first
        while self._queue:
            if not self._lock.acquire(timeout=0.5):
                continue
            try:
                if not self._queue:
                    return
                setting = self._queue[0]
                key = _setting_key(*setting)
                if key not in self.results:
                    try:
                        self.results[key] = self._search(setting, stop=self._stop)
                    except Stopped:
                        return  # get() searches now; it resumes this queue when done
                    except ValueError:
                        pass  # an impossible setting: the redraw says why when it gets there
                if self._queue and self._queue[0] == setting:
                    self._queue.pop(0)
            finally:
                self._lock.release()

    def cancel(self):
        """Drop what is queued and stop the background search now (what it priced stays in the memos)."""
        self._queue = []
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join()
        self._stop.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background searches to finish (tests, benchmarks); True if none is left."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self._queue


SEARCHES = Searches()  # the session's: every explorer shares it, so a setting is never searched twice


def neighbours(values: dict, options: dict) -> list[dict]:
    """The settings one step away from ``values`` on each control of ``options`` ({name: ordered values}): the
    nearer moves first (one step down and one up on each slider, in the order of ``options``)."""
    out = []
    for name, opts in options.items():
        opts = list(opts)
        if values[name] not in opts:
            continue
        i = opts.index(values[name])
        for j in (i + 1, i - 1):
            if 0 <= j < len(opts):
                out.append({**values, name: opts[j]})
    return out
