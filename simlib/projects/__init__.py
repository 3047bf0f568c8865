"""Hands-on projects trained on the one training loop (``simlib.train``): each is a ``Task``.

    gpt.GPTTask          project 1: a small GPT on real English text (model, text, task, run)
    vision.DigitsTask    project 2: a small ResNet with BatchNorm on scikit-learn's real handwritten digits,
                         upscaled and augmented on the fly (per-sample seeds)
    finance.HedgingTask  project 3: deep hedging of an option on Monte-Carlo paths calibrated to the S&P 500
                         series that ships inside the ``arch`` package; tested on the later, real years
    seeding              per-sample seeds, and the check that catches the same seed on every rank

Each project's standard run is its folder's ``run.py``; :mod:`simlib.projects.registry` registers them (one line
each), and ``simlib train``, :mod:`simlib.projects.runner`, the benchmarks and the grader find them there.
"""


def positive_int(name, value):
    """Raise ``ValueError`` unless ``value`` is an int >= 1 (a bool is not): the projects' argument check."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
