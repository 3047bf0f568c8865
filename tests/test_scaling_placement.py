"""A sweep over world sizes runs every world size on the same kind of device (issue 37: on one H200, world 1 ran
on the GPU over NCCL and worlds 2 and 4 on CPU ranks, and the table called that a 0.37x "speedup").

The GPU count is faked (torch.cuda.is_available / device_count, what ``simlib.env.gpu_count`` reads) and the
launches are replaced by a recorder: what is checked is the decision and that every world size gets it.
"""

import pandas as pd
import pytest
import torch

from simlib.lessons import scaling


def _fake_gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize(
    "gpus, kind, sizes, backend, device",
    [
        (0, "cpu", (1, 2, 4), "gloo", "cpu"),
        (1, "gpu-shared", (1, 2, 4), "gloo", "cuda:0"),
        (2, "gpu-shared", (1, 2, 4), "gloo", "cuda:0"),
        (4, "gpus", (1, 2, 4), "auto", "auto"),
        (8, "gpus", (1, 2, 4), "auto", "auto"),
    ],
)
def test_auto_puts_every_world_size_on_one_kind_of_device(monkeypatch, gpus, kind, sizes, backend, device):
    _fake_gpus(monkeypatch, gpus)
    p = scaling.placement((1, 2, 4))
    assert (p.kind, p.world_sizes, p.backend, p.device) == (kind, sizes, backend, device)
    assert bool(p.note) == (kind == "gpu-shared")  # said on the table and the plot


def test_the_other_choices_and_their_refusals(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    cpu = scaling.placement((1, 2, 4), "cpu")
    assert (cpu.kind, cpu.device, cpu.world_sizes) == ("cpu", "cpu", (1, 2, 4)) and "GPU" in cpu.note
    stop = scaling.placement((1, 2, 4), "gpus")
    assert stop.world_sizes == (1,) and stop.dropped == (2, 4)
    assert "stopped at 1 rank" in stop.note and "same kind of device" in stop.note
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="needs a GPU"):
        scaling.placement((1, 2), "gpu-shared")
    with pytest.raises(ValueError, match="devices must be one of"):
        scaling.placement((1, 2), "tpu")


def test_scaling_launches_every_world_size_alike_on_one_gpu(monkeypatch):
    """The sweep itself on a (faked) one-GPU machine: every launch gets Gloo on cuda:0, no CPU baseline row (it
    would be a CPU time beside GPU times), and the note reaches the table's attrs (the plot's title)."""
    _fake_gpus(monkeypatch, 1)
    launched = []

    def fake_measure(world_size, threads=1, backend="auto", device="auto", **kw):
        launched.append((world_size, threads, backend, device))
        t = 0.01 / world_size
        return (
            {
                "step_time": t,
                "step_time_iqr": 0.0,
                "steps": 3,
                "forward_time": t / 3,
                "backward_time": t / 3,
                "comm_time": 0.0,
                "optimizer_time": t / 3,
                "comm_fraction": 0.0,
                "exposed_comm_fraction": 0.0,
            },
            None,
        )

    monkeypatch.setattr(scaling, "measure", fake_measure)
    monkeypatch.setattr(scaling, "step_times", lambda timeline: pd.Series([0.01] * 3))
    table = scaling.scaling((1, 2, 4), width=8, depth=1, global_batch=8, steps=3, warmup=1, progress=False)
    assert [(w, b, d) for w, _, b, d in launched] == [
        (1, "gloo", "cuda:0"),
        (2, "gloo", "cuda:0"),
        (4, "gloo", "cuda:0"),
    ]
    assert table["baseline"].isna().all() and set(table["device"]) == {"gpu-shared"}
    assert table.attrs["placement"] == "gpu-shared" and "shares cuda:0" in table.attrs["placement_note"]
    stopped = scaling.scaling(
        (1, 2, 4), width=8, depth=1, global_batch=8, steps=3, warmup=1, progress=False, devices="gpus"
    )
    assert list(stopped["world_size"]) == [1] and "stopped at 1" in stopped.attrs["placement_note"]


def test_speedup_table_refuses_rows_from_unlike_devices():
    rows = [
        dict(
            world_size=w,
            threads=1,
            step_time=t,
            step_time_p25=t,
            step_time_p75=t,
            throughput=1 / t,
            baseline=None,
            device=d,
        )
        for w, t, d in ((1, 0.002, "gpus"), (2, 0.005, "cpu"))
    ]
    with pytest.raises(ValueError, match="same kind of device"):
        scaling.speedup_table(rows)
