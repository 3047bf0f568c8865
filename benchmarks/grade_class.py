"""`simlib grade` on a class of 22 notebooks: every solution (passes) and every generated exercise (not implemented).

Each submission is graded in its own child process (kernel + fresh workers), so this measures the isolated mode
that untrusted classes use. Writes results/grade_class.json: wall time, per-submission seconds, outcome, load.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    from simlib.grading import batch

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="grade-class-") as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        for path in sorted((ROOT / "solutions").glob("[0-9]*.ipynb")):
            shutil.copy(path, folder / f"solution_{path.name}")
            shutil.copy(ROOT / "exercises" / path.name, folder / f"exercise_{path.name}")
        seconds = {}

        def progress(text):
            print(text, flush=True)

        t0 = time.monotonic()
        rows = batch.grade([folder], timeout=300, progress=progress)
        wall = time.monotonic() - t0
    subs = {}
    for r in rows:
        subs.setdefault(Path(r.submission).name, []).append(r)
    for name, rs in subs.items():
        checks = [r for r in rs if r.kind == "check"]
        seconds[name] = dict(
            seconds=round(sum(r.seconds for r in rs), 1),
            checks=len(checks),
            passed=all(r.passed for r in checks) and bool(checks),
            status=sorted({r.status for r in checks}),
        )
    ok = all(v["passed"] == k.startswith("solution_") for k, v in seconds.items())
    result = dict(
        benchmark="grade_class",
        wall_s=round(wall, 1),
        submissions=len(subs),
        as_expected=ok,
        per_submission=seconds,
        **report.machine(load, note="2-core machine shared with other jobs"),
    )
    print(report.write(result), f"{wall:.0f} s for {len(subs)} submissions; as expected: {ok}")


if __name__ == "__main__":
    main()
