"""Registry for the red team's wrong answers: each answer is a factory (its docstring says the mistake or trick and
whether it is honest or deliberate) that returns the object a learner would hand to ``grading.check``."""


def answer(kind: str):
    """Mark a factory as one wrong answer of kind ``honest`` or ``deliberate``."""
    assert kind in ("honest", "deliberate"), kind

    def mark(factory):
        doc = (factory.__doc__ or "").strip()
        assert doc and "\n" not in doc, f"{factory.__name__}: a one-line docstring is required"
        factory.kind = kind
        return factory

    return mark


def answers_of(module) -> list:
    """The module's answer factories, in the order they are defined."""
    return [v for v in vars(module).values() if callable(v) and getattr(v, "kind", None) in ("honest", "deliberate")]


def watched() -> bool:
    """Whether something seems to be measuring this process right now (what a detect-the-grader answer asks):
    a dispatch mode, a tracer or profiler, saved-tensor hooks, or torch.distributed's functions replaced."""
    import sys

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    names = ("all_reduce", "send", "isend", "recv", "irecv", "all_gather_into_tensor", "broadcast")
    replaced = any(
        getattr(dist, n) is not getattr(c10d, n)
        or not getattr(getattr(dist, n), "__code__", None)
        or not getattr(dist, n).__code__.co_filename.endswith(("distributed_c10d.py", "c10d_logger.py"))
        for n in names
    )
    seen = {
        "dispatch mode": bool(_get_current_dispatch_mode_stack()),
        "tracer": bool(sys.gettrace() or sys.getprofile()),
        "collective replaced": replaced,
        "profiler": torch._C._autograd._profiler_enabled(),
        "saved-tensor hooks": torch._C._autograd._top_saved_tensors_default_hooks(False) is not None,
    }
    try:  # a record of what was seen, to tell afterwards which path each graded call took
        import os

        with open("/tmp/rt2_watched.log", "a") as f:
            f.write(
                f"{os.getpid()} {sys._getframe(1).f_code.co_qualname} {any(seen.values())} "
                f"{[k for k, v in seen.items() if v]}\n"
            )
    except OSError:
        pass
    return any(seen.values())
