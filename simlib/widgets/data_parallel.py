"""The explorer of lesson 02: bucket size -> messages and overlap."""

from __future__ import annotations

import numpy as np

from ._common import _figure, _hardware, _log_slider, _mb, _preset_dropdown, _wire


def bucket_figure(
    bucket_cap_mb: float,
    width: int = 1024,
    depth: int = 4,
    global_batch: int = 1024,
    world_size: int = 2,
    hardware="cpu",
    measured=None,
):
    """Bucket cap -> gradient buckets (``parallel.data.make_buckets`` on the lesson's MLP) and the simulator's
    replay of one overlapped data-parallel step; beside it messages and step time over every cap.

    ``hardware``: a preset name ("cpu", "a100", "h100") or a :class:`simlib.sim.Hardware` (e.g. calibrated);
    ``measured``: rows with ``bucket_cap_mb`` and ``step_ms`` (the lesson's sweep) to mark. Returns (figure, caption).
    """
    from .. import plots, sim
    from ..models import MLP
    from ..sim.grad_sync import gradient_buckets

    if global_batch % world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {world_size} ranks")
    hw = _hardware(hardware)
    model = sim.from_module(MLP(width, depth), name=f"MLP {depth}x{width}")

    def strategy(cap_mb):
        return sim.Strategy(
            dp=world_size,
            micro_batch=global_batch // world_size,
            bucket_bytes=cap_mb * 2**20,
            overlap=True,
            dtype="fp32",
            optimizer="sgd",
        )

    def step(cap_mb):
        table = sim.replay_data_parallel(model, hw, strategy(cap_mb), steps=2, warmup=1)
        one = table[(table.step == 1) & (table["rank"] == 0)]  # every rank alike: rank 0's spans
        busy = one[one.kind.isin(["forward", "backward", "optimizer"])].duration.sum()
        step_time = one[one.kind == "step"].duration.iloc[0]
        return table, step_time, step_time - busy

    grad_mb = _mb(model.params * 4)
    caps = np.geomspace(max(grad_mb / 2000, 1e-3), max(2 * grad_mb, 30.0), 30)
    curve = [(c, len(gradient_buckets(model, strategy(c))), *step(c)[1:]) for c in caps]
    table, step_time, exposed = step(bucket_cap_mb)
    messages = len(gradient_buckets(model, strategy(bucket_cap_mb)))
    fig, (ax_g, ax_c) = _figure(figsize=(13, 3.8))
    plots.gantt(
        table[table["rank"] == 0],
        ax=ax_g,
        step=1,
        title=f"predicted step, rank 0 ({messages} bucket(s) of ≤ {bucket_cap_mb:.3g} MB)",
    )
    ax_c.semilogx([c[0] for c in curve], [c[2] * 1e3 for c in curve], "k-", label="predicted step time")
    ax_c.semilogx([c[0] for c in curve], [c[3] * 1e3 for c in curve], "r--", label="predicted exposed comm")
    if measured is not None:
        rows = [
            r
            for r in (measured.to_dict("records") if hasattr(measured, "to_dict") else measured)
            if r.get("mode", "bucket") == "bucket"
        ]
        ax_c.plot(
            [r["bucket_cap_mb"] for r in rows],
            [r["step_ms"] for r in rows],
            "o",
            color="tab:blue",
            label="measured step (this lesson)",
        )
    ax_c.axvline(bucket_cap_mb, color="tab:orange", label="your cap")
    ax_c.axvline(grad_mb, color="gray", ls=":", label=f"all gradients {grad_mb:.1f} MB")
    ax_m = ax_c.twinx()
    ax_m.semilogx([c[0] for c in curve], [c[1] for c in curve], color="tab:green", drawstyle="steps-post")
    ax_m.set_ylabel("all-reduces per step", color="tab:green")
    ax_c.set(xlabel="bucket cap (MB)", ylabel="ms", title=f"{world_size} ranks on {hw.name}")
    ax_c.legend(fontsize=7, loc="upper center")
    ax_c.grid(alpha=0.3)
    fig.tight_layout()
    caption = (
        f"{model.name}, {grad_mb:.1f} MB of fp32 gradients, {world_size} ranks on {hw.name}: {messages} "
        f"all-reduce(s) per step; predicted step {step_time * 1e3:.3g} ms of which {exposed * 1e3:.3g} ms "
        f"is communication not hidden behind backward."
    )
    return fig, caption


def bucket_explorer(measured=None, width: int = 1024, depth: int = 4, global_batch: int = 1024):
    """Bucket cap, ranks and hardware -> buckets, overlap and step time; ``measured`` (the lesson's bucket
    sweep, on this machine) is marked when the hardware is the CPU box."""
    import ipywidgets as W

    controls = dict(
        bucket_cap_mb=_log_slider("cap (MB)", 4.0, 0.01, 100.0),
        world_size=W.SelectionSlider(options=[2, 4, 8], value=2, description="ranks"),
        hardware=_preset_dropdown(),
    )

    def draw(bucket_cap_mb, world_size, hardware):
        return bucket_figure(
            bucket_cap_mb,
            width,
            depth,
            global_batch,
            world_size,
            hardware,
            measured=measured if hardware == "cpu" and world_size == 2 else None,
        )

    return _wire(controls, draw)
