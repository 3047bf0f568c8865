"""Project 3: deep hedging of an option on paths calibrated to the S&P 500 series of the ``arch`` package (``task``)."""

from .task import SEEDINGS, HedgingTask, real_windows

__all__ = ["HedgingTask", "SEEDINGS", "real_windows"]
