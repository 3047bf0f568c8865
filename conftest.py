"""Root pytest configuration: quick mode for the tests and for the notebook kernels nbval starts."""
import os

os.environ.setdefault("SIMLIB_QUICK", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
