"""Distributed cells: ``%load_ext simlib``, then run a notebook cell on every rank of a warm cluster.

    %load_ext simlib

    %%distributed -n 2              # every rank runs the cell; its variables stay for the next cell
    x = torch.ones(2) * rank
    dist.all_reduce(x)
    print(x)                        # -> [rank0] tensor([1., 1.])   [rank1] tensor([1., 1.])

    %%distributed --ranks 0         # only the ranks listed run the cell (the others wait)
    x.sum()                         # a last expression is shown per rank: [rank0] Out: tensor(2.)

    %dist_pull x                    # x in the notebook: [rank 0's x, rank 1's x]
    %dist_push lr                   # the notebook's lr, now a variable on every rank
    %dist_close                     # stop the workers (their variables go with them)

Each rank keeps one namespace between cells, holding at first ``torch``, ``dist``, ``simlib``, ``ctx``
(:class:`simlib.Context`), ``rank`` and ``world_size``. The engine is :func:`simlib.cluster` (the kernel's warm
cluster: one made with ``simlib.cluster(n, timeout=...)`` in the notebook is used as it is), so errors, output and
interrupts behave as for :func:`simlib.launch`: a failure raises
:class:`simlib.WorkerError` with the rank and the cell's line (``Cell In[n], line k``); the interrupt button
stops every worker, and the next cell starts fresh ones (with empty namespaces, as simlib then says).
The function style (``simlib.launch(fn, n)``) stays the way for scripts; this is for exploring in a notebook.
"""

from __future__ import annotations

import ast
import sys

_namespace: dict | None = None  # in a worker: this rank's variables, kept between cells


def _rank_namespace(package) -> dict:
    """This worker's namespace for distributed cells (created on first use). ``package``: the ``simlib`` package
    object, handed in by the package's own entry point (``simlib._in_rank``): this module imports nothing above it."""
    global _namespace
    if _namespace is None:
        import torch
        import torch.distributed as dist

        from .env import context

        ctx = context()
        # the learner's cells see the package as if they had imported it
        _namespace = {
            "__name__": "__distributed__",
            "torch": torch,
            "dist": dist,
            "simlib": package,
            "ctx": ctx,
            "rank": ctx.rank,
            "world_size": ctx.world_size,
        }
    return _namespace


def _run_cell(package, source: str, filename: str, ranks) -> str | None:
    """Worker side of ``%%distributed``: run ``source`` in this rank's namespace; the repr of a last
    expression (if not None) comes back, as IPython would show it."""
    import torch.distributed as dist

    if ranks is not None and dist.get_rank() not in ranks:
        return None
    ns = _rank_namespace(package)
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), ns)  # noqa: S102 - the learner's own cell
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), ns)  # noqa: S307
        return None if value is None else repr(value)
    return None


def _get(package, names: list[str]) -> dict:
    ns = _rank_namespace(package)
    missing = [n for n in names if n not in ns]
    if missing:
        import torch.distributed as dist

        raise NameError(
            f"rank {dist.get_rank()} has no variable {', '.join(missing)} (define it in a %%distributed cell first)"
        )
    return {n: ns[n] for n in names}


def _set(package, values: dict) -> None:
    _rank_namespace(package).update(values)


def _cell_number(shell) -> int:
    """The number of the cell now running, as its prompt shows it (``In [n]``).

    IPython (8.x and 9.x) records the running cell's number in its ``ExecutionResult`` and then increments
    ``shell.execution_count`` *before* the cell runs, so during the cell ``execution_count`` is the next
    cell's number; the result the display hook holds is the running one's."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(result, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


def _parse_ranks(text: str | None, world_size: int):
    if text is None or text.strip() in ("", "all"):
        return None
    try:
        ranks = sorted({int(r) for r in text.replace(" ", "").split(",") if r != ""})
    except ValueError:
        raise ValueError(f"--ranks takes rank numbers separated by commas, e.g. --ranks 0,2; got {text!r}") from None
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad or not ranks:
        raise ValueError(f"--ranks {text}: ranks run from 0 to {world_size - 1} on this {world_size}-rank cluster")
    return ranks


def load_ipython_extension(ipython, in_rank) -> None:
    """Register ``%%distributed``, ``%dist_pull``, ``%dist_push`` and ``%dist_close``. ``in_rank(name, *args)``:
    the worker-side entry (``simlib._in_rank``) that calls this module's ``name`` with the package."""
    ipython.register_magics(_make_magics(in_rank)(ipython))


def _make_magics(in_rank):
    from IPython.core import magic_arguments as ma
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    @magics_class
    class DistributedMagics(Magics):
        """Cells that run on every rank of the kernel's warm cluster, each rank keeping its variables."""

        def __init__(self, shell):
            super().__init__(shell)
            self.world_size = 2
            self.timeout = None
            self._pids = None  # the workers that hold the namespaces

        def _cluster(self, world_size=None):
            from .launch import cluster, shared_cluster

            shared = shared_cluster()
            if shared is not None and world_size in (None, shared.world_size):
                self.world_size = shared.world_size  # the kernel's warm cluster, whatever its options
                return shared
            if world_size is not None and world_size != self.world_size:
                if self._pids is not None:
                    print(
                        f"simlib: {world_size} ranks instead of {self.world_size}: starting new workers "
                        "(variables from earlier cells are gone)",
                        file=sys.stderr,
                    )
                self.world_size = world_size
            return cluster(self.world_size)

        def _call(self, fn, *args, timeout=None):
            cluster = self._cluster()
            try:
                return cluster.call(in_rank, (fn.__name__, *args), timeout=timeout or self.timeout)
            finally:
                pids = cluster.pids  # empty when the call stopped the workers (an interrupt, a hang)
                if pids and self._pids and pids != self._pids:
                    print(
                        "simlib: these are fresh workers: variables from earlier distributed cells are gone",
                        file=sys.stderr,
                    )
                self._pids = pids or self._pids

        @ma.magic_arguments()
        @ma.argument(
            "-n",
            "--nproc",
            type=int,
            default=None,
            help="number of ranks (default 2, or the last number given); a new number starts new workers",
        )
        @ma.argument("-r", "--ranks", default=None, help="run on these ranks only, e.g. 0 or 0,2 (default: all)")
        @ma.argument("--timeout", type=float, default=None, help="seconds the whole cell may take")
        @cell_magic
        def distributed(self, line, cell):
            """Run this cell on every rank (or on --ranks) of a warm cluster; each rank keeps its variables."""
            args = ma.parse_argstring(self.distributed, line)
            cluster = self._cluster(args.nproc)
            ranks = _parse_ranks(args.ranks, cluster.world_size)
            # the cell, as the notebook numbers it: "Cell In[n], line k" in tracebacks, k counted from the
            # %%distributed line
            source = f"%%distributed {line}\n{cell}"
            filename = self.shell.compile.cache(source, _cell_number(self.shell))
            outs = self._call(_run_cell, "\n" + cell, filename, ranks, timeout=args.timeout)
            for rank, out in enumerate(outs):
                if out is not None:
                    print(f"[rank{rank}] Out: {out}")

        @ma.magic_arguments()
        @ma.argument("-r", "--rank", type=int, default=None, help="take this rank's value only")
        @ma.argument("names", nargs="+", help="variables to bring back")
        @line_magic
        def dist_pull(self, line):
            """Bring variables back from the ranks: ``%dist_pull x`` sets x = [rank 0's x, rank 1's x, ...]."""
            args = ma.parse_argstring(self.dist_pull, line)
            values = self._call(_get, args.names)
            if args.rank is not None and not 0 <= args.rank < len(values):
                raise ValueError(f"--rank {args.rank}: ranks run from 0 to {len(values) - 1}")
            for name in args.names:
                by_rank = [v[name] for v in values]
                self.shell.user_ns[name] = by_rank if args.rank is None else by_rank[args.rank]

        @line_magic
        def dist_push(self, line):
            """Send notebook variables to every rank: ``%dist_push lr model_size``."""
            names = line.split()
            missing = [n for n in names if n not in self.shell.user_ns]
            if not names or missing:
                raise NameError(f"%dist_push takes names of notebook variables; not defined here: {missing}")
            self._call(_set, {n: self.shell.user_ns[n] for n in names})

        @line_magic
        def dist_close(self, line):
            """Stop the workers of distributed cells (their variables go with them)."""
            from .launch import shared_cluster

            shared = shared_cluster()
            if shared is not None:
                shared.close()
            self._pids = None

    return DistributedMagics
