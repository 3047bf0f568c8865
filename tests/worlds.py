"""One rank trained in the test process, and nothing of it left after (the conftest's fixtures use it)."""

import os
from contextlib import contextmanager


@contextmanager
def one_process_world():
    """Training in this process (one rank, no launcher): its process group and the environment variables that made
    it go after (for a module-scoped fixture, which cannot use the ``one_process`` fixture)."""
    import simlib

    saved = dict(os.environ)
    try:
        yield
    finally:
        simlib.shutdown()
        os.environ.clear()
        os.environ.update(saved)
