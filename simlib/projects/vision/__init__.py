"""Project 2: a small ResNet with BatchNorm on scikit-learn's real handwritten digits (``task``)."""

from .task import LOADERS, DigitsTask, baseline_logistic, load_digits_split

__all__ = ["DigitsTask", "LOADERS", "baseline_logistic", "load_digits_split"]
