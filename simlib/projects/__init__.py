"""Hands-on projects trained on the one training loop (``simlib.train``): each is a ``Task``.

    gpt.GPTTask          project 1: a small GPT on real English text (model, text, task, run)
    vision.DigitsTask    project 2: a small ResNet with BatchNorm on scikit-learn's real handwritten digits,
                         upscaled and augmented on the fly (per-sample seeds)
    finance.HedgingTask  project 3: deep hedging of an option on Monte-Carlo paths calibrated to the S&P 500
                         series that ships inside the ``arch`` package; tested on the later, real years
    seeding              per-sample seeds, and the check that catches the same seed on every rank
    gpu                  what the GPU sizes share (``simlib train <name> --size gpu``; chosen by itself when every
                         rank has a GPU): the GPUs' facts, precision, micro-batches; each size is its project's
    template/            the folder a new project starts from (an MLP on scikit-learn's diabetes data; not
                         registered: ``tests/test_project_template.py`` registers a copy)

Each project's folder declares it in its ``run.py`` (its task, sizes quick/full/gpu, milestone);
:mod:`simlib.projects.registry` registers them (one line each), and ``simlib train``, ``simlib plan``,
:mod:`simlib.projects.runner`, the GPU check, the benchmarks and the grader find them there.
"""


def positive_int(name, value):
    """Raise ``ValueError`` unless ``value`` is an int >= 1 (a bool is not): the projects' argument check."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_data_device(name: str, choice) -> None:
    """``ValueError`` unless ``choice`` is "cpu" or "cuda" (without touching CUDA: the launcher's parent checks it)."""
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be 'cpu' or 'cuda', got {choice!r}")


def data_device(choice: str):
    """Where a project makes its batches: ``"cuda"`` is this rank's GPU when there is one (the GPU sizes, whose CPU
    cannot warp images or draw paths as fast as the GPU trains on them), else the CPU; ``"cpu"`` the CPU."""
    import torch

    check_data_device("the data device", choice)
    if choice == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
