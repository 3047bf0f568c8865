"""Loss parity with tolerance bands (simlib.debug.parity): plans that agree, and planted bugs that do not."""

from simlib.debug import parity
from simlib.projects.gpt.task import GPTTask
from simlib.train import OptimConfig, Plan

OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, weight_decay=0.1, grad_clip=1.0)


class SameBatch:
    """A planted bug: from step ``start`` on, every data-parallel rank gets the first rank's share."""

    def __init__(self, task, start=0):
        self.task, self.start = task, start

    def __getattr__(self, name):
        if name.startswith("__") or "task" not in self.__dict__:  # while unpickling
            raise AttributeError(name)
        return getattr(self.task, name)

    def batch(self, index, part=0, parts=1):
        return self.task.batch(index, 0 if index >= self.start else part, parts)


def test_dp_and_tp_agree_within_the_band_and_a_planted_bug_does_not(cluster2):
    task = GPTTask.quick()
    same = parity.compare(task, Plan(tp=2), Plan(dp=2), steps=6, optim=OPTIM, cluster=cluster2)
    assert same.agree, str(same)
    assert "agrees with tp2 within what summation order explains" in str(same)
    assert all(n > 0 for n in same.noise[1:])  # the permuted twins really reorder the sums
    assert set(same.parameters) >= {"embed.wte.weight", "blocks.0.attn.qkv.weight"}

    bug = parity.compare(
        task, Plan(tp=2), Plan(dp=2), steps=6, optim=OPTIM, task_b=SameBatch(task, start=3), cluster=cluster2
    )
    assert not bug.agree and bug.first_step == 3, str(bug)
    assert "leaves tp2's band at step 3" in str(bug)
    # re-run to step 3: the parameters that produced step 3's loss are still inside their bands (the data differ)
    assert bug.parameter_ratio <= 1, str(bug)
