"""Secret, generated instances: what each check runs an answer on is drawn at check time, in the grader's process.

A check's problems used to come from fixed seeds, so an answer could return a table of the expected outputs,
and from a few hand-picked sizes, so a ``//`` where those sizes happened to divide passed. Now each exercise
states a Hypothesis *strategy* of the instances a learner gets wrong (sizes that do not divide, odd widths, frozen
and unused parameters, unequal micro-batches, ranks that own nothing, every dtype the exercise names, 2 to 5
ranks), and :func:`draw` takes a fixed, small number of them from it with randomness from the operating system
(``os.urandom``), in this process. The workers receive only the plain values drawn (sizes, seeds, tensors); no
seed in any importable module decides an instance, so nothing an answer can read or import tells it what it
will be asked.

When an answer fails, :func:`smallest` asks Hypothesis to shrink: it searches the same strategy for the smallest
instance that still fails (within a small budget of runs, as grading must stay quick) and the hint shows it,
which is also the best feedback a learner can get ("fails with 3 ranks and 7 elements").
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
