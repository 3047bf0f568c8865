"""Secret, generated instances: what each check runs an answer on is drawn at check time, in the grader's process.

A check's problems used to come from fixed seeds, so an answer could return a table of the expected outputs,
and from a few hand-picked sizes, so a ``//`` where those sizes happened to divide passed. Now each exercise
states a Hypothesis *strategy* of the instances a learner gets wrong (sizes that do not divide, odd widths, frozen
and unused parameters, unequal micro-batches, ranks that own nothing, every dtype the exercise names, 2 to 5
ranks), and :func:`draw` takes a fixed, small number of them from it with randomness from the operating system
(``os.urandom``), in this process. The workers receive only the plain values drawn (sizes, seeds, tensors); no
seed in any importable module decides an instance, so nothing an answer can read or import tells it what it
will be asked.

When an answer fails, :func:`shrink` asks Hypothesis to shrink: :func:`around` states the instances no larger than
the failing one drawn (fewer ranks, smaller sizes, without float64 or a frozen parameter), Hypothesis replays the
drawn one and shrinks from it, and the hint names the smallest instance that still fails and what differed there,
which is also the best feedback a learner can get ("2 ranks, an MLP of width 3, ...: max error 1"). The search runs
only after a failure, within a small budget of runs (6) and seconds (20), each run with a short limit and no
second chance: a slow run ends it and is not called failing, and the verdict never changes (:func:`smallest`, the
older form, searches a strategy afresh).
"""

from __future__ import annotations

import os
import random


def entropy() -> random.Random:
    """A random generator seeded from the operating system, in this process: a module-level seed decides nothing."""
    return random.Random(int.from_bytes(os.urandom(16), "big"))


def secret_seed() -> int:
    """A seed for the workers' tensors, drawn here from the OS (63 bits, so torch.Generator takes it)."""
    return int.from_bytes(os.urandom(8), "big") >> 1


def _settings(examples: int, shrink: bool):
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def draw(strategy, count: int, key=repr) -> list:
    """``count`` distinct instances of ``strategy`` (a Hypothesis strategy), drawn with OS entropy.

    Hypothesis generates a few more than asked (its first example is the strategy's simplest, always the same,
    so it is left out while others exist); ``count`` of the rest are chosen at random, again from OS entropy."""
    from hypothesis import find
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    seen, found = set(), []

    def keep(instance) -> bool:
        k = key(instance)
        if k not in seen:
            seen.add(k)
            found.append(instance)
        return False  # never "found": Hypothesis goes on generating until max_examples

    try:
        find(strategy, keep, settings=_settings(count + 4, shrink=False), random=entropy())
    except (NoSuchExample, Unsatisfiable):
        pass
    pool = found[1:] if len(found) > count else found  # the simplest example is the one anyone could guess
    return entropy().sample(pool, min(count, len(pool)))


def smallest(strategy, fails, budget: int = 8, first=None):
    """The smallest instance of ``strategy`` for which ``fails(instance)`` is true, as Hypothesis shrinks it,
    using at most ``budget`` calls of ``fails`` (each is a run on the workers); ``first``, a failing instance
    already known, is returned when the search finds nothing smaller within the budget.

    ``fails`` must return a bool and raise nothing (a run that errs counts as failing)."""
    from hypothesis import find
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    verdicts, calls = {}, [0]

    def still_fails(instance) -> bool:
        k = repr(instance)
        if k not in verdicts:
            if calls[0] >= budget:
                return False  # out of budget: keep the smallest failure found so far
            calls[0] += 1
            try:
                verdicts[k] = bool(fails(instance))
            except Exception:  # noqa: BLE001 - an instance that makes the answer err is a failing one
                verdicts[k] = True
        return verdicts[k]

    try:
        return find(strategy, still_fails, settings=_settings(max(2, budget // 2), shrink=True), random=entropy())
    except (NoSuchExample, Unsatisfiable):
        return first
    except Exception:  # noqa: BLE001 - Hypothesis's own complaint (e.g. flaky): fall back on what is known
        return first


def describe(instance: dict, names: dict | None = None) -> str:
    """An instance as the hint shows it: ``3 ranks, 7 elements, float64``."""
    names = names or {}
    parts = []
    for k, v in instance.items():
        if k.startswith("_") or k == "seed":
            continue
        label = names.get(k, k.replace("_", " "))
        parts.append(f"{label} {v}" if not isinstance(v, str) else f"{label} {v}")
    return ", ".join(parts)


def around(first: dict, sizes: dict, choices: dict | None = None, keep=None):
    """A strategy of instances no larger than ``first``, the failing one drawn, for :func:`shrink` to search.

    ``sizes``: {field: lower bound (an int: the integers from it up to ``first``'s value) or the allowed values (a
    tuple: those up to ``first``'s)}: Hypothesis shrinks each toward its smallest. ``choices``: {field: its simplest
    value}: the field is that or ``first``'s (a float64 model, a frozen parameter: shrinking tries without it).
    Every other field (the secret seed among them) stays ``first``'s. ``keep``: a filter (e.g. sizes that must not
    divide); instances it rejects are never run."""
    from hypothesis import strategies as st

    fields, path = {}, []  # path: the choices Hypothesis makes to draw ``first`` itself (where shrinking starts)
    for k, v in first.items():
        if k in sizes:
            bound = sizes[k]
            if isinstance(bound, tuple):
                allowed = sorted(x for x in bound if x <= v) or [v]
                allowed = allowed if v in allowed else allowed + [v]
                fields[k] = st.sampled_from(allowed)
                path.append(allowed.index(v))
            else:
                fields[k] = st.integers(min(bound, v), v)
                path.append(v)
        elif choices and k in choices and choices[k] != v:
            fields[k] = st.sampled_from((choices[k], v))
            path.append(1)
        else:
            fields[k] = st.just(v)
    strategy = st.fixed_dictionaries(fields)
    strategy = strategy.filter(keep) if keep is not None else strategy
    _STARTS[id(strategy)] = (strategy, tuple(path))
    return strategy


_STARTS: dict = {}  # id(strategy from around()) -> (the strategy, the choices that draw its ``first``)


def _key(instance) -> str:
    return repr(sorted(instance.items())) if isinstance(instance, dict) else repr(instance)


def shrink(strategy, differs, first, grader=None, budget: int = 6, seconds: float = 20.0):
    """(the smallest instance of ``strategy`` on which the answer is wrong, what differed there), as Hypothesis
    shrinks it, for a hint; ``(first, "")`` when the search finds nothing (or is not made).

    ``differs(instance)`` runs the answer on the workers and returns what differed ("" when it is right there);
    at most ``budget`` runs and about ``seconds`` of search, made only after a failure: a run that raises (the
    answer erred or hung on that instance) counts as failing and ends the search (a hang's run is long). Nothing
    is searched for the planted wrong answers of the test suite (``grader.first_failure``), which need only the
    verdict. The verdict itself is never changed here: the search only adds words to a failure's hint."""
    import time

    from hypothesis import Phase, find, settings
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    from .results import HANG

    start = _STARTS.pop(id(strategy), None)
    if grader is not None and (grader.first_failure or grader.unanswered):
        return first, ""
    said, runs, t0, stopped = {_key(first): "as drawn"}, [0], time.monotonic(), [False]  # first fails: no run
    options = _settings(max(2, budget // 2), shrink=True)
    key = None
    if start is not None and start[0] is strategy:  # shrinking starts from the drawn instance itself (replayed)
        db, key = InMemoryExampleDatabase(), b"first"
        db.save(key, choices_to_bytes(start[1]))
        options = settings(options, database=db, phases=[Phase.reuse, Phase.generate, Phase.shrink])

    def still_fails(instance) -> bool:
        k = _key(instance)
        if k not in said:
            if stopped[0] or runs[0] >= budget or time.monotonic() - t0 > seconds:
                said[k] = ""  # out of budget: the smallest failure found so far stands
                return False
            runs[0] += 1
            try:
                said[k] = differs(instance) or ""
            except Exception as exc:  # noqa: BLE001 - the answer erred there: a failing instance, and the last run
                stopped[0] = True
                result = getattr(exc, "result", None)
                if result is not None and result.status == HANG:  # too slow for the search's short limit (a busy
                    said[k] = ""  # machine, or a hang): not called failing, as nothing is known of it
                else:
                    said[k] = (
                        f"{result.name}: {result.detail}" if result is not None else f"{type(exc).__name__}: {exc}"
                    )
        return bool(said[k])

    saved = None
    if grader is not None:  # the search's runs are short and get no second chance: a slow one ends the search
        saved, grader.timeout, grader.second_chance = (
            (grader.timeout, grader.second_chance),
            min(grader.timeout, 5.0),
            False,
        )
    try:
        small = find(strategy, still_fails, settings=options, random=entropy(), database_key=key)
    except (NoSuchExample, Unsatisfiable):
        return first, ""
    except Exception:  # noqa: BLE001 - Hypothesis's own complaint (e.g. flaky): fall back on what is known
        return first, ""
    finally:
        if saved is not None:
            grader.timeout, grader.second_chance = saved
    return small, said.get(_key(small), "")


def smallest_words(instance: dict, what: str, describe_fn=None) -> str:
    """The hint's sentence for :func:`shrink`'s find: `` Smallest failing instance found: 2 ranks, width 3: ....``"""
    if not what:
        return ""
    words = (describe_fn or describe)(instance)
    return f" Smallest failing instance found (Hypothesis shrank the drawn one): {words}: {what.rstrip('.')}."
