"""A piece's code, fingerprinted: a pieces milestone need not re-grade a piece that passed its own exercise earlier
in the same session with the very same code (issue 48's projects: each piece's check cell, then the milestone).

The fingerprint is computed in a worker (the answer is opened nowhere else): the bytecode, constants and names of
every function and method of the piece, of the learner's own base classes and of the functions, classes and plain
constants it reads from its globals (a helper in another cell changed after the check changes the fingerprint).
Anything else it cannot see into (a partial, a callable instance) has no fingerprint, and is always re-graded.
Only a passed verdict is remembered, in the process that grades (``simlib grade`` starts fresh: it re-grades all).
"""

from __future__ import annotations

PASSED: set = set()  # (exercise, fingerprint) that passed in this process
PIECE_CHECKS: set = set()  # the exercises some project's slot is graded by (a pass of one is remembered)


def fingerprint(obj) -> str | None:
    """In a worker: a hash of ``obj``'s code and what it reads, or None when it cannot be seen into."""
    import hashlib
    import types

    h = hashlib.sha256()
    seen: set = set()

    def learners(o) -> bool:  # code the learner wrote (a notebook's cells, a file of theirs), not a library's
        module = getattr(o, "__module__", "") or ""
        return not module.startswith(("simlib", "torch", "numpy", "builtins", "math", "typing", "collections"))

    def code(c):
        h.update(c.co_code + repr((c.co_names, c.co_varnames, c.co_freevars)).encode())
        for k in c.co_consts:
            code(k) if isinstance(k, types.CodeType) else h.update(repr(k).encode())

    def function(f):
        if id(f) in seen:
            return
        seen.add(id(f))
        code(f.__code__)
        h.update(repr((f.__defaults__, f.__kwdefaults__)).encode())
        for cell in f.__closure__ or ():
            walk(cell.cell_contents)
        for name in f.__code__.co_names:  # what it reads from its module's globals
            if name in f.__globals__:
                walk(f.__globals__[name])

    def walk(o):
        if isinstance(o, (int, float, str, bytes, bool, type(None))):
            h.update(repr(o).encode())
        elif isinstance(o, types.FunctionType):
            if learners(o):
                function(o)
        elif isinstance(o, type):
            if not learners(o) or id(o) in seen:
                h.update(f"{getattr(o, '__module__', '')}.{o.__qualname__}".encode())
                return
            seen.add(id(o))
            h.update(o.__qualname__.encode())
            for base in o.__mro__[1:]:
                walk(base)
            for key, value in sorted(vars(o).items()):
                h.update(key.encode())
                value = getattr(value, "__func__", value)  # staticmethod / classmethod
                if isinstance(value, property):
                    for f in (value.fget, value.fset):
                        walk(f)
                else:
                    walk(value)
        elif isinstance(o, types.ModuleType):
            h.update(o.__name__.encode())
        else:  # an object of another kind: its type only (its state could change unseen)
            h.update(repr(type(o)).encode())

    if not isinstance(obj, (types.FunctionType, type)):
        return None
    walk(obj)
    return h.hexdigest()


def remember(exercise: str, print_: str | None) -> None:
    if print_:
        PASSED.add((exercise, print_))


def passed_before(exercise: str, print_: str | None) -> bool:
    return bool(print_) and (exercise, print_) in PASSED
