"""A step on processes that share a CPU's cores: processor sharing, for a box whose ranks outnumber its cores.

On a CPU box (this machine: 4 or 8 ranks on 2 cores) a rank is not a device of its own. The OS shares the cores
among the ranks that have work; a rank that waits (in a pipeline bubble, on a peer's message, in a blocking
collective) gives its core to the others. Two bounds then hold for a step, and the larger is the step:

- the critical path: the step as if every rank had a core of its own (``predict`` at ``processes = cores``:
  the rates calibrate() measured with one process per core, bubble included);
- the total work over the cores: every rank's compute, optimizer and communication at the rates measured with
  all ranks running at once (``predict`` at the real process count, each rank's share of the cores already in
  its rates), but no bubble: the time a rank idles in a bubble is time the others compute in — nor what a
  pipeline's lighter stages idle beside the slowest (the work is the mean stage's, not the slowest one's).

Data-parallel ranks all compute at once, so the second bound holds and their step is the contended one; a
pipeline's bubble costs nothing beyond its critical path. A GPU has no such term: ``Hardware.own_cores`` is None
there (and wherever each process has a core of its own), and the step is ``predict``'s as it was.
"""

from __future__ import annotations

from dataclasses import replace


def shared_step(contended: float, bubble: float, alone: float) -> tuple[float, str]:
    """(step seconds, the bound that set it): the larger of the step with a core per rank (``alone``) and the
    contended step without the time its ranks idle (``contended − bubble``: the pipeline's bubble and what its
    lighter stages idle beside the slowest, ``stage_idle``)."""
    work = contended - bubble
    return (alone, "critical path") if alone >= work else (work, "cores' total work")


def combine_prediction(contended, alone):
    """One :class:`~simlib.sim.cost.Prediction` from ``predict`` at the real process count (``contended``) and
    at a core per process (``alone``): the terms of the bound that sets the step (see the module)."""
    idle = contended.breakdown.get("stage_idle", 0.0)
    step, bound = shared_step(contended.step_time, contended.bubble + idle, alone.step_time)
    base = alone if bound == "critical path" else replace(contended, bubble=0.0)
    scale = contended.step_time / step  # throughput and MFU: the contended ones, at the new step
    return replace(
        base,
        step_time=step,
        memory=contended.memory,
        fits=contended.fits,
        throughput=contended.throughput and contended.throughput * scale,
        tokens_per_s=contended.tokens_per_s and contended.tokens_per_s * scale,
        mfu=contended.mfu and contended.mfu * scale,
        breakdown={
            **base.breakdown,
            "shared_cores": bound,
            "contended_step": contended.step_time,
            "own_core_step": alone.step_time,
        },
    )


def combine_entry(contended: dict, alone: dict) -> dict:
    """The planner's priced entry (``FastPricer.price``'s dict) combined as :func:`combine_prediction`."""
    step, bound = shared_step(
        contended["step_time"], contended["bubble"] + contended.get("stage_idle", 0.0), alone["step_time"]
    )
    base = dict(alone) if bound == "critical path" else {**contended, "bubble": 0.0}
    scale = contended["step_time"] / step
    base.update(
        step_time=step,
        tokens_per_s=contended["tokens_per_s"] * scale,
        mfu=contended["mfu"] * scale,
        shared_cores=bound,
        contended_step=contended["step_time"],
        own_core_step=alone["step_time"],
    )
    return base
