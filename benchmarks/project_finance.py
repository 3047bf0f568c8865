"""Project 3 (finance): samples/s (paths/s) and time to beat the Black-Scholes delta's held-out loss at
1 process x 1 thread, 1 process x 2 threads, 2 and 4 processes, through simlib.train (the project's standard
run). Same method as project_vision.py. Run: `python benchmarks/project_finance.py [rounds] [--quick]`;
writes benchmarks/results/project_finance.json.
"""

import sys

from project_vision import measure, show

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--quick"]
    show(measure("finance", *(int(a) for a in args), quick="--quick" in sys.argv))
