"""Checks for the graded exercises: pass/fail with a hint that teaches, never a crashed kernel.

A learner's cell calls ``grading.check("ring_all_reduce", ring_all_reduce)``; each check prints one
line as it finishes (``✔`` / ``✘`` and a hint) and ``check`` returns a :class:`Report`. Rules:

- The learner's code runs on real worker processes (``simlib.Cluster``) with a time limit; an
  exception there is reported with its rank and last line, a hang as a hang (the workers restart).
- Only there: ``check`` turns the answer into bytes at once (``core.Sent``), the workers unpickle and run it, and
  what comes back is plain data of exact types (``Cluster.call(plain=True)``, :mod:`simlib.plain`). A check asks a
  worker (``grader.ask``) for anything it needs to know of the answer; it never calls or reads it itself.
- An untouched exercise (``raise NotImplementedError()``, the stub the generator writes) is reported as
  "not implemented yet", not as an error.
- Nothing the learner does makes ``check`` raise (except Ctrl-C, which stops it).
- Every check starts from healthy workers: a learner's code that destroys the process group, exits or kills
  its worker is named, with the rank that did it (not another rank's echo of it), and the workers restart.
- Each exercise runs on 2, 3 and 4 ranks, several on 5 too (and several sizes), so code right only for one world size, a power
  of two or a hard-coded constant fails; rules such as "send/recv only" are checked where a renamed call
  cannot slip past (torch's dispatcher) and by the volume the ring must send.
- Instances are secret and generated (:mod:`simlib.grading.instances`): each check draws its sizes, values and
  hyper-parameters at check time, in this process, from Hypothesis strategies of what learners get wrong, with
  the OS's randomness (no seed in any module decides one); a failing ring case is shrunk to the smallest that fails.
- A busy machine is not a hang (:mod:`simlib.grading.busy`): each run's limit scales with the load measured at that
  moment, and a run that trips it is retried once, with "your machine was busy (load X on N cores)".
- What crosses between ranks is also read from outside the answer's process, from the kernel's TCP counters
  (:mod:`simlib.grading.wire`); a function checked on fresh problems runs in a process of its own behind an audit
  hook it cannot remove (:mod:`simlib.grading.answer_box`).
- The algorithm is checked, not only its output (:mod:`simlib.grading.contracts`): the ring all-reduce and ring
  attention talk to their neighbours only, the MoE moves tokens by all-to-all, the TP layers make one all-reduce
  each way. Problems that an answer could rebuild are joined by ones drawn at check time from ``secrets``, and an
  answer run in this process is refused when it calls the grader's own code and stopped after a time limit.

Adding checks for a new exercise (lessons 04+ do the same): write a generator decorated with
:func:`exercise` that takes ``(answer, grader)`` and yields :class:`Result` values. ``grader.run(world_size,
harness, *args)`` runs a module-level ``harness`` on every rank and returns the per-rank values; put
harnesses and checks in the module of their topic (``data_parallel.py`` for lessons 01-03,
``model_parallel.py`` for 04-05, or a new one imported at the bottom of this file; they import the machinery from ``core``)::

    @exercise("my_exercise")
    def _my_exercise(answer, grader):
        outs = grader.run(2, _my_harness, answer)          # stops the exercise cleanly on error/hang
        yield Result("equal to the reference on 2 ranks", ok, hint="what to look at when it is not")
"""

from __future__ import annotations

# The exercises register themselves with @exercise when their modules are imported.
from . import (  # noqa: E402,F401
    context_experts,  # noqa: E402,F401  (lesson 09: ring attention)
    data_parallel,
    fault_tolerance,
    gpt_pieces,  # noqa: E402,F401  (project 10's pieces)
    memory,  # noqa: E402,F401  (lesson 07)
    milestones,  # noqa: E402,F401  (a project's declared MILESTONE -> its graded check: milestones.milestone)
    model_parallel,
    moe,  # noqa: E402,F401  (lesson 09's MoE dispatch)
    one_device,  # noqa: E402,F401  (lesson 05b)
    planner,  # noqa: E402,F401  (lesson 13)
    prefetch,  # noqa: E402,F401  (lesson 09b)
    projects,
    vision_batchnorm,  # noqa: E402,F401  (project 2's learner pieces: sync_batchnorm)
    vision_finance,
    vision_shard,  # noqa: E402,F401  (project 2's learner pieces: data_shard)
    zero3_linear,  # noqa: E402,F401  (lesson 07)
)
from .core import (  # noqa: F401
    EXERCISES,
    FAIL,
    HANG,
    PASS,
    TODO,
    Grader,
    ProcessGroupBroken,
    Report,
    Result,
    __all__,  # noqa: F401
    _close,
    _Stop,
    check,
    close,
    cluster,
    exercise,
    max_error,
)
from .milestones import milestone  # noqa: F401 - grading.milestone("<project>") registers "<project>_milestone"
from .pieces_milestone import pieces_milestone  # noqa: F401,E402 - "<project>_pieces_milestone": with the learner's pieces
