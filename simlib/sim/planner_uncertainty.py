"""How sure the planner is: each plan's 80 % interval, the plans tied with the best, and the plausibility guard.

A plan's interval is :func:`simlib.sim.by_source.interval`, the same band whose coverage of left-out sources'
runs ``benchmarks/sim_by_source.py`` reports: a new source's offset (the spread of the published sources' mean
leave-one-source-out errors) plus its runs' scatter (within-source, by family and scale), read from the committed
``simlib/sim/data/loso_bands.json``. Two plans whose intervals
overlap are **tied**: the simulator's error on runs from sources it has not seen is larger than the gap between
them, so ranking one above the other would be ranking noise. Every plan of one search shares the model and the
GPU count, so it shares the interval's relative width: a plan ties with the best when its step is within the
ratio high / low of the best's. That is conservative — the errors of two layouts of one run are correlated, and
part of the error cancels between them — but no published source measures that correlation, so it is not assumed.

The plausibility guard: a predicted MFU above the best any published run of the set measured on that part and dtype
(:func:`simlib.sim.by_source.plausibility`) is flagged on the plan and in the report.
"""

from __future__ import annotations


def interval(result, entry) -> dict:
    """{"low", "high", "basis", "runs"}: the 80 % interval of ``entry``'s step time (seconds)."""
    from .by_source import interval as _interval
    from .by_source import part_of

    if part_of(result.hardware) is None:
        return dict(low=None, high=None, basis=f"no published run on {result.hardware.name}", runs=0)
    return _interval(result.model, result.world_size, entry["step_time"])


def ties(result) -> list[dict]:
    """The ranked plans whose interval overlaps the best plan's (the best first). Only the best when no interval
    can be stated (a family with too few published runs)."""
    if not result.ranked:
        return []
    best = interval(result, result.best)
    if best["high"] is None:
        return [result.best]
    return [r for r in result.ranked if interval(result, r)["low"] <= best["high"]]


def plausibility(result, entry) -> str:
    """'' or the flag for a plan predicted above the best published MFU of its part and dtype."""
    from .by_source import plausibility as _plausibility

    return _plausibility(result.hardware, entry["strategy"].dtype, entry.get("mfu"))


def lines(result) -> list[str]:
    """What the report says about the ranking's uncertainty (empty when nothing fits)."""
    if not result.ranked:
        return []
    best = result.best
    band = interval(result, best)
    if band["high"] is None:
        out = [f"\nuncertainty: no interval ({band['basis']}): the ranking is the simulator's alone, unchecked"]
    else:
        tied = ties(result)
        shown = (
            "all of the ranked plans"
            if len(tied) == len(result.ranked) and result.top is None
            else (f"{len(tied)} of the {len(result.ranked):,} ranked plans")
        )
        out = [
            f"\nuncertainty: the best plan's 80 % interval is {band['low']:.4g}–{band['high']:.4g} s per step (the "
            f"errors of {band['runs']} published runs from sources left out, {band['basis']}); {shown} overlap it "
            "and are tied with it: their order is within the simulator's error"
        ]
    flag = plausibility(result, best)
    if flag:
        out.append(f"plausibility: {flag}")
    return out
