"""Issues 47 and 51: a busy machine never fails a right answer; an unanswered exercise starts nothing; the checks'
instances are secret and drawn at check time."""

import os
import subprocess
import sys
import time
from pathlib import Path

from simlib import grading
from simlib.exercises import load_answers
from simlib.grading import busy, core
from simlib.grading import grader as grader_module

ROOT = Path(__file__).resolve().parent.parent


def test_an_unanswered_exercise_starts_nothing(monkeypatch):
    """`Sent.of(None)` is no answer: the grader reports "not implemented yet" without starting a worker (notebook
    10's `grading.check("gpt_plan", None)` started a 1-rank cluster)."""
    assert core.Sent.of(None) is None

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for an unanswered exercise")

    monkeypatch.setattr(grader_module, "cluster", no_cluster)
    for name in ("gpt_plan", "ring_all_reduce", "sharded_optimizer"):
        report = grading.check(name, None, quiet=True)
        assert report.status == "not implemented", (name, report.results)


def test_a_run_past_its_limit_gets_a_second_chance_and_the_machine_is_named(cluster2, monkeypatch, capsys):
    """A run that trips its (quiet-machine) limit is retried once with a longer one, and the learner reads that the
    machine was busy, not that the code hangs."""
    quiet = busy.Load(load=0.0, cores=2, contention=1.0)
    monkeypatch.setattr(busy.Load, "now", classmethod(lambda cls, ranks=1, refresh=False: quiet))
    grader = core.Grader({2: cluster2}, timeout=2.0)
    assert grader.run(2, time.sleep, 2.5) == [None, None]  # past 2 s, within the retry's 4 s
    assert grader.busy_notes and "your machine was busy (load 0.0 on 2 cores" in grader.busy_notes[0]


def test_limits_scale_with_the_load():
    assert busy.limit_for(30, busy.Load(load=8.0, cores=2, contention=1.0)) == 120
    assert busy.limit_for(30, busy.Load(load=0.5, cores=2, contention=3.0)) == 90
    assert busy.limit_for(30, busy.Load(load=0.5, cores=2, contention=1.0), retry=True) == 60
    assert busy.contention() >= 1.0


def test_instances_are_drawn_at_check_time_from_os_entropy():
    """Two checks draw different problems (no seed in any module decides them); each covers what learners get
    wrong: lengths that do not divide, fewer elements than ranks, both dtypes; frozen and unused parameters."""
    from simlib.grading.data_parallel import _draw_problem, _ring_cases

    first, second = _ring_cases(), _ring_cases()
    assert first != second
    for world_size, cases in first.items():
        assert cases[0]["shape"][0] % world_size  # a length that does not divide
        assert cases[1]["shape"][0] < world_size or world_size == 2  # fewer elements than ranks
        assert {c["dtype"] for c in cases} == {"float32", "float64"}
    problem = _draw_problem(frozen=True, unused=True)
    assert problem["frozen"] is not None and problem["unused"]


def test_a_solution_passes_beside_a_cpu_burner(cluster2, cluster3, cluster4):
    """Issue 51: a right answer passes while the machine is kept at 4x its cores by busy loops."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * busy.cores())]
    try:
        answer = load_answers(ROOT / "solutions" / "02_average_gradients.ipynb")["average_gradients"]
        report = grading.check(
            "average_gradients", answer, clusters={2: cluster2, 3: cluster3, 4: cluster4}, quiet=True
        )
        assert report.passed, "\n".join(r.line() for r in report.results)
    finally:
        for b in burners:
            b.kill()
        for b in burners:
            b.wait()
    assert os.getloadavg()[0] > 0
