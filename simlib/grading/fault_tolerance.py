"""Checks for lesson 08's exercise: save and restore the full training state (``full_state``).

The learner writes a :class:`simlib.train.TrainState` subclass whose ``state_dict()`` / ``load_state_dict()`` hold
everything a resumed run needs. The checks train the lessons' MLP with dropout (so the run draws random numbers
every step) through the one training loop on 2 ranks, stop at step 6, start again from the step-4 checkpoint and
compare the losses with the uninterrupted run, bit for bit (same world size, same operations in the same order).
A curve that leaves the uninterrupted one is compared with the runs that restore everything but one part (the
optimizer state, the RNG state, the data position): the hint names the part whose omission gives that curve.
The last check kills rank 1 for real (SIGKILL) and lets the elastic agent restart both ranks.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .core import ERROR, HANG, TODO, Result, _guarded, exercise

_STEPS, _EVERY, _STOP, _KILL = 12, 4, 6, 6
PARTS = ("optimizer", "rng", "data")
HINTS = {
    "optimizer": "your curve is the one of a run that restored everything but the OPTIMIZER STATE: AdamW's moments "
    "(exp_avg, exp_avg_sq) and its step count start from zero again, so the steps after the restart "
    "differ. Save self.optimizer.state_dict() and load it back with self.optimizer.load_state_dict()",
    "rng": "your curve is the one of a run that restored everything but the RNG STATE: after the restart dropout draws "
    "its masks from a generator seeded as at step 0, not where the uninterrupted run was. Save "
    "checkpoint.rng_state() under the key 'rng' (simlib gathers one per rank) and restore it with "
    "checkpoint.set_rng_state()",
    "data": "your curve is the one of a run that restored everything but the DATA POSITION: the restarted run reads the "
    "global batches from index 0 again (samples repeated, the ones after them skipped) while its step and "
    "learning rate go on. Save self.data_step (the index of the next global batch) and restore it",
}


class _RankStreams:
    """``task``, but after the model is built every rank reseeds torch's generator with a seed of its own: ranks
    draw different dropout masks, as data-parallel dropout and augmentation really do. So a checkpoint that
    keeps one rank's RNG state for all (or none) does not resume bit-equal."""

    def __init__(self, task, base: int = 1000):
        self.task, self.base = task, base

    def __getattr__(self, name):
        if name in ("task", "base"):
            raise AttributeError(name)
        return getattr(self.task, name)

    def build_model(self):
        import random

        import numpy as np
        import torch
        import torch.distributed as dist

        model = self.task.build_model()
        seed = self.base + 7919 * (dist.get_rank() if dist.is_initialized() else 0)
        torch.manual_seed(seed)  # every generator a full state must save: torch CPU (and CUDA), Python, NumPy
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed + 3)
        random.seed(seed + 1)
        np.random.seed(seed + 2)
        return model

    def batch(self, step, part=0, parts=1):
        """The task's batch, its inputs scaled by a jitter drawn from every generator (:func:`drawn_generators`):
        a state that saves torch's CPU generator alone does not resume bit-equal."""
        x, y = self.task.batch(step, part, parts)
        jitter = 1.0 + 0.05 * sum(draw() - 0.5 for draw in drawn_generators().values())
        return x * jitter, y


def drawn_generators() -> dict:
    """One draw from each generator a full state must save: Python's, NumPy's, torch's CPU one and, whenever a
    GPU is there (initialised yet or not), CUDA's. The task draws from all of them every step, so a state that
    leaves one out does not resume bit-equal."""
    import random

    import numpy as np
    import torch

    draws = {"python": random.random, "numpy": lambda: float(np.random.rand()), "torch": lambda: float(torch.rand(()))}
    if torch.cuda.is_available():
        draws["cuda"] = lambda: float(torch.rand((), device="cuda"))
    return draws


def ft_problem():
    """A Hypothesis strategy of the run the checks train: the MLP's width and depth, its dropout, a global batch
    that 2, 3 and 4 ranks divide, the task's seed and the ranks' generators' (secret: a table of the lesson's
    curve cannot pass)."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            width=st.integers(9, 40),
            depth=st.integers(1, 3),
            global_batch=st.sampled_from((24, 36, 48)),
            dropout=st.sampled_from((0.1, 0.2, 0.3)),
            seed=st.integers(0, 2**31 - 1),
            streams=st.integers(0, 2**31 - 1),
        )
    )


def _task(problem: dict | None = None):
    from ..tasks import RegressionTask

    p = problem or dict(width=32, depth=2, global_batch=48, dropout=0.2, seed=0, streams=1000)  # the lesson's
    task = RegressionTask(
        width=p["width"],
        depth=p["depth"],
        global_batch=p["global_batch"],
        num_samples=16 * p["global_batch"],
        dropout=p["dropout"],
        seed=p["seed"],
    )
    return _RankStreams(task, p["streams"])


_LIBRARY_OFF = (
    "the library's TrainState.{0} is switched off in this exercise: build the state from its parts "
    "yourself (model, optimizer, scheduler, step, data position, every rank's RNG state)"
)


class LibraryStateUsed(RuntimeError):
    """The learner's state delegated to the library's TrainState.state_dict / load_state_dict."""


def _refuse_state_dict(self, *args, **kwargs):
    # runs as TrainState.state_dict's code, with simlib.train's globals: it imports what it needs
    import simlib.grading.fault_tolerance as grader

    raise grader.LibraryStateUsed(grader._LIBRARY_OFF.format("state_dict"))


def _refuse_load_state_dict(self, *args, **kwargs):
    import simlib.grading.fault_tolerance as grader

    raise grader.LibraryStateUsed(grader._LIBRARY_OFF.format("load_state_dict"))


def _learners_own(state_type):
    """Run with ``state_type``, the library's own TrainState.state_dict / load_state_dict switched off: what is
    graded is what the learner wrote, not what the base class already does. The functions' *code* is swapped, not
    the class attributes, so every alias refuses too: one bound to an instance attribute (``self.state_dict =
    MethodType(saved, self)``), kept in a variable before the check, or reached through ``super()``."""
    import contextlib

    from ..train import TrainState

    @contextlib.contextmanager
    def switched_off():
        functions = {
            TrainState.__dict__["state_dict"]: _refuse_state_dict.__code__,
            TrainState.__dict__["load_state_dict"]: _refuse_load_state_dict.__code__,
        }
        saved = {f: f.__code__ for f in functions}
        try:
            for f, refuse in functions.items():
                f.__code__ = refuse
            yield
        finally:
            for f, code in saved.items():
                f.__code__ = code

    return switched_off() if state_type is not None else contextlib.nullcontext()


def _optim():
    from ..train import OptimConfig

    return OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, decay_steps=_STEPS, grad_clip=1.0)


def _losses(state_type, directory, steps, leave_out=(), task=None, out_dir=None, problem=None) -> dict:
    """Train on every rank (from ``directory``'s latest checkpoint if any); the losses by step."""
    import torch.distributed as dist

    from .. import checkpoint
    from ..train import Plan, train

    plan = Plan(dp=dist.get_world_size(), checkpoint_dir=directory, checkpoint_every=_EVERY if directory else 0)
    with checkpoint.leaving_out(*leave_out), _learners_own(state_type):
        record = train(
            task or _task(problem),
            plan,
            steps=steps,
            optim=_optim(),
            log_every=1,
            verbose=False,
            measure_memory=False,
            state_type=state_type,
            out_dir=out_dir,
        )
    return {r["step"]: r["loss"] for r in record.rows}


def _resume_harness(state_type, directory, problem, leave_out=()):
    """Stop at step 6, then a fresh run (new model, optimizer, generators) resumes from the step-4 checkpoint."""
    _losses(state_type, directory, _STOP, problem=problem)
    return _losses(state_type, directory, _STEPS, leave_out, problem=problem)


def _reference_harness(problem):
    return _losses(None, None, _STEPS, problem=problem)


def _kill_harness(state_type, directory, out_dir, problem):
    from ..faults import KillAt

    task = _task(problem)
    killed = _RankStreams(KillAt(task.task, step=_KILL, rank=1), task.base)
    return _losses(state_type, directory, _STEPS, task=killed, out_dir=out_dir)


def _first_gap(curve: dict, reference: dict) -> str:
    for step in sorted(reference):
        if step in curve and curve[step] != reference[step]:
            return f"first different at step {step}: {curve[step]:.6f} instead of {reference[step]:.6f}"
    return ""


def _keys_harness(directory) -> list:
    """In a worker: the names of every entry of the learner's last checkpoint, from DCP's metadata (a pickle the
    learner's code wrote: it is read there, never in the process that computes the verdict)."""
    from torch.distributed.checkpoint import FileSystemReader

    from .. import checkpoint
    from ..plain import exact_str

    path = checkpoint.latest(directory)
    return [exact_str(k) for k in FileSystemReader(str(path)).read_metadata().state_dict_metadata] if path else []


def _kind_harness(answer):
    """In a worker: None if the answer is not a TrainState subclass, else which of the two methods it wrote."""
    from ..train import TrainState

    if not (isinstance(answer, type) and issubclass(answer, TrainState)):
        return None
    return [m for m in ("state_dict", "load_state_dict") if getattr(answer, m) is not getattr(TrainState, m)]


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises ValueError when the cell is empty
        return True
    except ValueError:
        return False


def _contents(keys) -> Result:
    """What the learner's last checkpoint holds (``keys``: the names of every saved entry)."""
    wanted = {
        "the model's weights": lambda k: k.endswith("net.0.weight"),
        "the optimizer's moments (exp_avg)": lambda k: k.endswith("exp_avg"),
        "the step": lambda k: k == "step",
        "every rank's RNG state (key 'rng')": lambda k: k.startswith("rng."),
    }
    missing = [name for name, found in wanted.items() if not any(found(k) for k in keys)]
    return Result(
        "the checkpoint holds the weights, the optimizer's moments, the step and the RNG states",
        not missing,
        "state_dict() should return them all: missing " + ", ".join(missing),
        f"{len(keys)} entries" if not missing else "missing " + ", ".join(missing),
    )


def after_a_real_kill(answer, work, reference, limit: float, problem: dict | None = None) -> Result:
    """Rank 1 is killed for real at step 6 and the elastic agent restarts both ranks: the resumed curve must go on
    bit-equal. Each attempt is a phase under the grader's call limit (``limit`` seconds, as every other phase):
    an answer that stalls after the restart fails after about two limits, not when it pleases."""
    import time

    from ..faults import read_run
    from ..launch import WorkerError, WorkerTimeout, launch

    name = f"rank 1 killed at step {_KILL}, restarted: the curve continues bit-equal"
    print(f"now rank 1 is killed (SIGKILL) at step {_KILL}; the elastic agent restarts both ranks:", flush=True)
    t0 = time.monotonic()
    try:
        out = launch(
            _guarded,
            2,
            _kill_harness,
            (answer, os.path.join(work, "killed"), os.path.join(work, "run"), problem),
            {},
            max_restarts=1,
            timeout=20,
            threads=1,
            call_timeout=limit,
            plain=True,
        )
    except WorkerError as exc:
        attempts = read_run(os.path.join(work, "run"))
        timed_out = isinstance(exc, WorkerTimeout)
        return Result(
            name,
            False,
            status=HANG if timed_out else ERROR,
            hint=(
                f"after the restart your code did not finish within {limit:g} s (each attempt has the "
                "same limit as every other phase): does load_state_dict (or anything after a restart) "
                "wait, sleep or loop?"
                if timed_out
                else "your code failed after the real restart: " + str(exc).splitlines()[0]
            ),
            detail=f"stopped after {time.monotonic() - t0:.0f} s; {len(attempts)} attempt(s) recorded",
        )
    attempts = read_run(os.path.join(work, "run"))
    killed_ok = (
        len(attempts) == 2
        and min(out[0]) == _EVERY
        and all(o == {s: reference[s] for s in range(_EVERY, _STEPS)} for o in out)
    )
    return Result(
        name,
        killed_ok,
        "after the real restart the curve differs: is anything in your state kept only in memory "
        "(a Python attribute set during training and not saved)?",
        f"{len(attempts)} attempts; resumed at step {min(out[0]) if out[0] else None}",
    )


def _ft_smallest(answer, grader, problem: dict, work: str) -> str:
    """The smallest run Hypothesis finds whose resumed curve still leaves the uninterrupted one on 2 ranks (3 tries
    at most, each an uninterrupted run and a resumed one, only after a failure); nothing for the tests of planted
    answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if grader.first_failure:
        return ""
    tries = []

    def fails(p) -> bool:
        tries.append(1)
        try:
            reference = grader.run(2, _reference_harness, p)[0]
            resumed = grader.run(2, _resume_harness, answer, os.path.join(work, f"smallest{len(tries)}"), p)
        except _Stop:
            return True
        return not all(out == {s: reference[s] for s in range(_EVERY, _STEPS)} for out in resumed)

    p = smallest(ft_problem(), fails, budget=3, first=problem)
    return (
        f" (smallest failing run found: width {p['width']}, depth {p['depth']}, batch {p['global_batch']}, "
        f"dropout {p['dropout']})"
    )


@exercise("full_state")
def _check_full_state(answer, grader):
    own = grader.ask(_kind_harness, answer, what="your class")
    if own is None:
        yield Result(
            "the answer is a TrainState subclass",
            False,
            "define `class FullState(TrainState)` with state_dict() and load_state_dict(), then pass the "
            "class itself (not an instance) to grading.check",
        )
        return
    if len(own) < 2:
        yield Result(
            "you wrote state_dict() and load_state_dict()",
            False,
            status=TODO,
            hint="not done yet: TrainState's own methods are switched off in this exercise - write both "
            "state_dict() and load_state_dict() in your class" + (f" (you wrote only {own[0]})" if own else ""),
        )
        return
    # a copy of the library's own code is not refused (issue 47: the library is open); `simlib grade` notes a
    # close structural match for the teacher (simlib.grading.similarity)
    from .instances import draw

    problem = draw(ft_problem(), 1)[0]  # drawn now, in this process, from the OS's randomness
    work = tempfile.mkdtemp(prefix="simlib-grade-08-")
    try:
        reference = grader.run(2, _reference_harness, problem, what="the uninterrupted run on 2 ranks")[0]
        resumed = grader.run(
            2, _resume_harness, answer, os.path.join(work, "yours"), problem, what="your state on 2 ranks"
        )
        starts = min(resumed[0]) if resumed[0] else None
        yield Result(
            "a fresh run resumes from the step-4 checkpoint",
            starts == _EVERY,
            "the run did not continue from its checkpoint: load_state_dict must restore self.step (the "
            "optimizer steps done) and the data position, so the loop starts at step 4, not 0",
            f"first step after the restart: {starts}",
        )
        yield _contents(grader.ask(_keys_harness, os.path.join(work, "yours"), what="reading your checkpoint"))
        equal = all(out == {s: reference[s] for s in range(_EVERY, _STEPS)} for out in resumed)
        hint = (
            "the resumed curve leaves the uninterrupted one; "
            + _first_gap(resumed[0], reference)
            + ". Save and restore the model, the optimizer, the LR scheduler, the step, the data position and "
            "the RNG state"
        )
        if not equal and starts == _EVERY:
            for part in PARTS:
                bug = grader.run(
                    2,
                    _resume_harness,
                    None,
                    os.path.join(work, part),
                    problem,
                    (part,),
                    what=f"the run without the {part} state",
                )[0]
                if bug == resumed[0]:
                    hint = HINTS[part]
                    break
        if not equal:  # the smallest run Hypothesis finds that still fails, in the hint
            hint += _ft_smallest(answer, grader, problem, work)
        yield Result(
            "2 ranks: the resumed curve equals the uninterrupted one, bit for bit",
            equal,
            hint,
            "" if not equal else f"steps {_EVERY}-{_STEPS - 1} equal",
        )
        if not equal:
            return
        for n in (3, 4):  # other world sizes: every rank has its own dropout stream
            ref_n = grader.run(n, _reference_harness, problem, what=f"the uninterrupted run on {n} ranks")
            res_n = grader.run(
                n, _resume_harness, answer, os.path.join(work, f"yours{n}"), problem, what=f"your state on {n} ranks"
            )
            bad = [r for r in range(n) if res_n[r] != {s: ref_n[0][s] for s in range(_EVERY, _STEPS)}]
            yield Result(
                f"{n} ranks: the resumed curve equals the uninterrupted one, bit for bit",
                not bad,
                f"on {n} ranks rank {bad[0] if bad else 0}'s resumed curve leaves the uninterrupted one; "
                + (_first_gap(res_n[bad[0]], ref_n[0]) if bad else "")
                + ". Each rank draws its own dropout masks: save and restore every rank's own RNG state "
                "(checkpoint.rng_state() under 'rng'), not one rank's for all",
                "" if bad else f"steps {_EVERY}-{_STEPS - 1} equal on every rank",
            )
            if bad:
                return
        yield after_a_real_kill(answer, work, reference, grader.timeout, problem)
    finally:
        shutil.rmtree(work, ignore_errors=True)
