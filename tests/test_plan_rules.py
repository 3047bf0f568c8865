"""Each rule of a plan is written once, in ``simlib/parallel/dims.py``; the trainer's Plan, the rank grid and the
simulator's Strategy ask it, and a plan is checked once on its way from the CLI to the loop (issue 34, part 1)."""

import pathlib
import re

import pytest

from simlib.parallel import dims
from simlib.plan import Plan

ROOT = pathlib.Path(__file__).resolve().parents[1] / "simlib"
HOME = ROOT / "parallel" / "dims.py"
# the files where the twins lived (issue 34), and the ones that could grow them again
WATCHED = [
    "train.py",
    "plan.py",
    "parallel/mesh.py",
    "projects/runner.py",
    "sim/strategy.py",
    "parallelize.py",
    "projects/gpt/task.py",
    "cli_train.py",
    "dry_run.py",
]
# a rule -> how a second copy of it reads (its code or its message)
TWINS = {
    "ep divides dp x cp": r"^\s*if\b.*%\s*\(?\w+\.ep\b|does not divide the dp x cp",
    "the world size": r"\b(self|plan|mesh)\.world_size\s*!=|!=\s*(self|plan|mesh)\.world_size\b|needs \{[^}]*\} ranks"
    r"|multiply to the world size",
    "the ZeRO stage range": r"in \(0, 1, 2, 3\)|must be 0, 1, 2 or 3|stage must be 1, 2 or 3",
    "ep without experts": r"ep\s*>\s*1\s+and\s+not\b|is dense|no MoEFeedForward|no mixture-of-experts",
    "the batch split": r"global_batch\s*%|does not split into dp=",
    "the sequence-length divisor": r"seq_len\s*%|seq_len is \{",
}


def _hits(pattern: str, path: pathlib.Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]


@pytest.mark.parametrize("rule", TWINS)
def test_each_rule_is_written_once(rule):
    pattern = TWINS[rule]
    assert _hits(pattern, HOME), f"{rule}: not found in {HOME.name} (did the rule move? update TWINS)"
    twins = [h for f in WATCHED if (ROOT / f).exists() for h in _hits(pattern, ROOT / f)]
    assert not twins, f"{rule} is spelled again outside parallel/dims.py (ask dims.check instead):\n" + "\n".join(twins)


def test_the_twin_finder_finds_a_twin(tmp_path):
    """The check above can fail: the old copies (as they read before issue 34) are found."""
    old = tmp_path / "old.py"
    old.write_text(
        "if tokens % plan.ep:\n    pass\nif self.zero_stage not in (0, 1, 2, 3):\n    pass\n"
        "if ep > 1 and not self.moe_experts:\n    pass\nif global_batch % (plan.dp * per_step):\n    pass\n"
        "if cp > 1 and self.seq_len % (2 * cp):\n    pass\nif self.world_size != world_size:\n    pass\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert all(_hits(pattern, old) for pattern in TWINS.values())
    finally:
        ROOT = saved


def test_plan_mesh_and_strategy_give_the_same_answer():
    """One function decides: the trainer's Plan, the grid and the simulator's Strategy refuse alike."""
    from simlib import sim
    from simlib.parallel.mesh import Mesh

    for ask in (
        lambda: Plan(dp=2, tp=2).validate(8),
        lambda: Mesh(dp=2, tp=2).check_world(8),
        lambda: sim.Strategy(dp=2, tp=2).validate(world_size=8),
        lambda: dims.check(dp=2, tp=2, world_size=8),
    ):
        with pytest.raises(ValueError, match=r"needs 4 ranks but the world has 8 \(the degrees multiply"):
            ask()
    for ask in (lambda: Plan(zero_stage=4), lambda: sim.Strategy(zero_stage=4)):
        with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3, got 4"):
            ask()
    with pytest.raises(ValueError, match="ep=3 does not divide the dp x cp = 4 ranks"):
        Mesh(dp=2, cp=2, ep=3)
    with pytest.raises(ValueError, match="ep=3 does not divide the dp x cp = 4 ranks"):
        Plan(dp=2, cp=2, ep=3).validate()
    with pytest.raises(ValueError, match="global batch 30 does not split into dp=2 ranks x 4 accumulation"):
        sim.Strategy.from_plan(Plan(dp=2, accumulation=4), global_batch=30)


def test_a_plan_is_checked_once_for_a_world_and_a_task(monkeypatch):
    """The CLI, train_on and the trainer all ask; the rules run the first time only (also after pickling, as
    the plan travels to a worker), and again for another world or another task."""
    import pickle

    from simlib.projects.gpt import GPTTask

    calls = []
    real = dims.check
    monkeypatch.setattr(dims, "check", lambda **kw: (calls.append(kw), real(**kw))[1])
    plan, task = Plan(dp=2), GPTTask.quick()
    plan.validate(2, task)
    first = len(calls)
    assert first > 0
    plan.validate(2, task)
    pickle.loads(pickle.dumps(plan)).validate(2, pickle.loads(pickle.dumps(task)))
    assert len(calls) == first, "the same plan, world and task were checked again"
    plan.validate(2, GPTTask.quick(global_batch=8))
    assert len(calls) > first, "another task must be checked"
    with pytest.raises(ValueError, match="needs 2 ranks"):
        plan.validate(4, task)
    assert plan == Plan(dp=2) and hash(plan) == hash(Plan(dp=2))  # the memo is not a field
