"""The learner's answer as bytes (:class:`Sent`), opened only in a worker, and the guard a harness runs under there
(:func:`_guarded`: the process group must be left as it was)."""

from __future__ import annotations


class ProcessGroupBroken(RuntimeError):
    """The learner's code destroyed or replaced the process group the grader's workers share."""


def _what_broke(world) -> str:
    import torch.distributed as dist

    if not dist.is_initialized():
        return "called dist.destroy_process_group()"
    if dist.group.WORLD is not world:
        return "replaced the process group (dist.init_process_group again)"
    return ""


class Sent:
    """A learner's answer as cloudpickle bytes: all the process that computes a verdict ever holds of it.

    ``grading.check`` wraps the answer in one (``simlib grade`` builds it from the bytes the learner's kernel sent,
    without unpickling them); :meth:`Grader.run` sends it to the workers, where :func:`_guarded` unpickles it
    before the harness runs. So the answer's ``__reduce__``, constructor, properties and methods run only in
    worker processes, and what comes back is plain data (``Cluster.call(..., plain=True)``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = bytes(data)

    @classmethod
    def of(cls, answer) -> Sent | None:
        """The answer as bytes; ``None`` (an unanswered exercise) stays ``None``: it is no answer, and the grader
        starts nothing for it (issue 51)."""
        import cloudpickle

        if answer is None:
            return None
        return answer if type(answer) is cls else cls(cloudpickle.dumps(answer))

    def __repr__(self) -> str:
        return f"<the learner's answer, {len(self.data):,} bytes, opened only in a worker>"


def _open(value):
    """In a worker: the learner's object for a :class:`Sent`, anything else as it is."""
    if type(value) is Sent:
        import cloudpickle

        return cloudpickle.loads(value.data)
    return value


def _guarded(harness, args, kwargs):
    """Run ``harness`` on this rank (the learner's answer unpickled here, in the worker), then check that the
    learner's code left the process group alone."""
    import torch.distributed as dist

    world = dist.group.WORLD
    try:
        args, kwargs = tuple(_open(a) for a in args), {k: _open(v) for k, v in kwargs.items()}
        out = harness(*args, **kwargs)
    except BaseException as exc:
        broke = _what_broke(world)
        if broke:
            raise ProcessGroupBroken(broke) from exc
        raise
    broke = _what_broke(world)
    if broke:
        raise ProcessGroupBroken(broke)
    return out


def _probe():
    """A healthy worker: its process group is up and every rank meets at a barrier."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ProcessGroupBroken("no process group")
    dist.barrier()


# failures that are only the echo of another rank's problem (its peer died, left, or never came)
