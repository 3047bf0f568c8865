"""The host's cost per eager op (simlib/sim/host_ops.py): the op counts are simlib's GPT's, and a micro-batch pays
them once each where calibrate() measured the cost of an op."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _ops(layers):
    from simlib.projects.gpt import GPTTask

    task = GPTTask(seq_len=32, hidden=64, num_layers=layers, num_heads=4, global_batch=8)
    model = task.build_model()
    x, y = torch.randint(0, 50, (2, 32)), torch.randint(0, 50, (2, 32))
    forward, backward = _Count(), _Count()
    with forward:
        loss = task.loss(model(x), y)
    with backward:
        loss.backward()
    return forward.n, backward.n


def test_the_op_counts_are_simlibs_gpt_block_and_ends():
    from simlib.sim.host_ops import GPT_OPS_ENDS, GPT_OPS_PER_LAYER

    (f2, b2), (f3, b3) = _ops(2), _ops(3)
    assert (f3 - f2, b3 - b2) == GPT_OPS_PER_LAYER
    assert (f2 - 2 * GPT_OPS_PER_LAYER[0], b2 - 2 * GPT_OPS_PER_LAYER[1]) == GPT_OPS_ENDS


def test_each_micro_batch_pays_its_ops_where_the_op_was_measured():
    from simlib import sim
    from simlib.sim.cost import gpt_stage
    from simlib.sim.host_ops import GPT_OPS_ENDS, GPT_OPS_PER_LAYER

    hw = sim.preset("cpu")
    box = hw.with_(overheads={"kernels": {2: {"op": 2e-5}}})
    model = sim.gpt(layers=4, hidden=128, heads=4, seq_len=64, vocab=1000)
    s = sim.Strategy(dp=2, micro_batch=4, dtype="fp32")
    plain, measured = gpt_stage(model, hw, s, 2), gpt_stage(model, box, s, 2)
    straggle = box.straggler(2)
    assert measured["forward"] - plain["forward"] * straggle == pytest.approx(
        straggle * 2e-5 * (4 * GPT_OPS_PER_LAYER[0] + GPT_OPS_ENDS[0])
    )
    assert measured["backward"] - plain["backward"] * straggle == pytest.approx(
        straggle * 2e-5 * (4 * GPT_OPS_PER_LAYER[1] + GPT_OPS_ENDS[1])
    )
    full = gpt_stage(model, box, s.replace(recompute="full"), 2)["backward"] - measured["backward"]
    bare = gpt_stage(model, hw, s.replace(recompute="full"), 2)["backward"] - plain["backward"]
    assert full - bare * straggle == pytest.approx(straggle * 2e-5 * 4 * GPT_OPS_PER_LAYER[0])  # the forward again
    four = sim.predict(model, box, s.replace(micro_batch=1, num_micro_batches=4), 2).compute
    one = sim.predict(model, hw, s.replace(micro_batch=1, num_micro_batches=4), 2).compute
    assert four - one * straggle == pytest.approx(
        4 * straggle * 2e-5 * sum(4 * a + b for a, b in zip(GPT_OPS_PER_LAYER, GPT_OPS_ENDS)), rel=1e-6
    )


def test_the_block_calibrate_times_dispatches_the_projects_blocks_ops():
    """calibrate times ``simlib.models.TransformerBlock`` (the simulator may not import the project); it must
    dispatch the ops the project's GPT block does, forward and backward."""
    from simlib.models import TransformerBlock
    from simlib.projects.gpt.model import Block, GPTConfig

    torch.manual_seed(0)
    counts = []
    for block in (Block(GPTConfig(hidden=32, num_heads=4, seq_len=8)), TransformerBlock(32, 4)):
        x = torch.randn(2, 8, 32, requires_grad=True)
        forward, backward = _Count(), _Count()
        with forward:
            out = block(x).sum()
        with backward:
            out.backward()
        counts.append((forward.n, backward.n))
    assert counts[0] == counts[1]


def test_a_micro_batch_pays_the_blocks_own_op_where_it_was_measured():
    """``kernels["block_op"]`` (a GPT block's ops timed at a size with no arithmetic to speak of) prices the
    host's cost per op where calibrate measured it; the 4x4 multiply's ``op`` where it is all there is."""
    from simlib import sim
    from simlib.sim.host_ops import host_op_time
    from simlib.sim.kernels import block_op_time

    hw = sim.preset("cpu")
    assert host_op_time(hw.with_(overheads={"kernels": {2: {"op": 2e-5}}}), 2) == 2e-5
    assert host_op_time(hw.with_(overheads={"kernels": {2: {"op": 2e-5, "block_op": 5e-5}}}), 2) == 5e-5
    assert host_op_time(hw, 2) == 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a calibrating rank times it
    try:
        per_op = block_op_time(0.05)
    finally:
        torch.set_num_threads(threads)
    assert 0 < per_op < 1e-2, per_op  # ~6 µs alone here; a loaded test run pays many times that, not 10 ms
