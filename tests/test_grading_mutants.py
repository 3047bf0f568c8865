"""The mutant generator behind benchmarks/grader_mutation.py: every operator fires, only inside the answer."""

from pathlib import Path

from simlib.grading import mutants as M

ROOT = Path(__file__).resolve().parent.parent

SNIPPET = '''import torch
import torch.distributed as dist


def f(x, n):
    """docstring stays"""
    y = x.sum()
    ### BEGIN SOLUTION
    z = (x - x.max(-1, keepdim=True).values).exp().detach()
    for i in range(1, n):
        if i < n and i is not None:
            z[i:n] += z[i - 1] * 2.5
    dist.all_reduce(z)
    return torch.cat([z, z.clone()], 0)
    ### END SOLUTION
'''


def test_every_operator_fires_inside_the_region_only():
    cells = [(SNIPPET, [(8, 15)])]
    found = M.mutate(cells)
    ops = {m.operator for m in found}
    assert ops >= {
        "arith",
        "compare",
        "constant",
        "delete",
        "swap_args",
        "off_by_one",
        "collective",
        "detach",
        "max_shift",
    }, ops
    assert all(8 < m.line < 15 for m in found)  # `y = x.sum()` (line 7) is the skeleton's
    texts = ["\n".join(m.sources) for m in found]
    assert len(set(texts)) == len(texts)
    shift = next(m for m in found if m.operator == "max_shift")
    assert "z = x.exp().detach()" in shift.sources[0]
    assert any("dist.broadcast(z, src=0)" in t for t in texts) and any("dist.reduce(z, dst=0)" in t for t in texts)
    for m in found:  # every mutant compiles
        compile(m.sources[0], "m", "exec")


def test_a_short_answer_gets_fifty_with_higher_order_mutants_and_they_load():
    cells = M.answer_cells(ROOT / "solutions" / "02_average_gradients.ipynb")
    found = M.mutate(cells, at_least=50, seed=0)
    assert len(found) >= 50 and any("+" in m.operator for m in found)
    namespace = M.load(found[0].sources, "mutant 0")
    assert callable(namespace["average_gradients"])
