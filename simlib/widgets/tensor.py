"""The explorer of lesson 05: tensor-parallel communication volume."""

from __future__ import annotations

import numpy as np

from ._common import _figure, _hardware, _preset_dropdown, _wire


def tp_figure(batch: int, seq: int, hidden: int, tp_size: int, hardware="cpu", dtype: str = "fp32", measured=None):
    """All-reduce bytes of one Megatron MLP block per step (``parallel.tensor.comm_volume``) and their time
    (``sim.cost.all_reduce``) against the block's GEMM time (``sim.cost.gemm_time``), for t = 1, 2, 4, 8.

    ``measured``: rows with ``seq``, ``batch``, ``hidden``, ``measured_MB`` (the lesson's CommLog) to mark.
    Returns (figure, caption).
    """
    from ..parallel.tensor import comm_volume
    from ..sim.cost import all_reduce, gemm_time

    hw = _hardware(hardware)
    if hidden % tp_size or min(batch, seq, hidden) < 1:
        raise ValueError(f"hidden ({hidden}) must split evenly over tp = {tp_size}")
    nbytes = 4 if dtype == "fp32" else 2

    def costs(t, s=seq):
        vol = comm_volume(batch, s, hidden, t, nbytes)
        tokens, ffn = batch * s, 4 * hidden // t
        processes = min(t, hw.devices_per_node)
        forward = gemm_time(tokens, hidden, ffn, hw, dtype, processes) + gemm_time(
            tokens, ffn, hidden, hw, dtype, processes
        )
        comm = 2 * all_reduce(vol["payload_bytes"], t, hw) if t > 1 else 0.0
        return vol, 3 * forward, comm  # backward ≈ 2 × forward GEMMs

    fig, (ax_v, ax_t) = _figure()
    seqs = np.unique(np.geomspace(16, max(4096, seq), 40).astype(int))
    ax_v.loglog(
        seqs,
        [costs(tp_size, s)[0]["step_payload_bytes"] / 1e6 for s in seqs],
        "k-",
        label=f"formula 2·B·S·H·{nbytes} B (B={batch}, H={hidden})",
    )
    ax_v.loglog(
        seqs,
        [costs(tp_size, s)[0]["per_rank_bytes"] / 1e6 for s in seqs],
        "k:",
        label=f"sent per rank, ring, t={tp_size}",
    )
    rows = measured.to_dict("records") if hasattr(measured, "to_dict") else (measured or [])
    if rows:
        ax_v.plot(
            [r["seq"] for r in rows],
            [r["measured_MB"] for r in rows],
            "o",
            color="tab:red",
            label="measured (CommLog), " + ", ".join(sorted({f"B={r['batch']} H={r['hidden']}" for r in rows})),
        )
    vol, compute, comm = costs(tp_size)
    ax_v.plot([seq], [vol["step_payload_bytes"] / 1e6], "r*", ms=14)
    ax_v.set(xlabel="sequence length S", ylabel="MB per block per step", title="all-reduce volume")
    degrees = [1, 2, 4, 8]
    parts = [costs(t) for t in degrees]
    ax_t.bar([str(t) for t in degrees], [p[1] * 1e3 for p in parts], color="tab:blue", label="GEMMs (fwd + bwd)")
    ax_t.bar(
        [str(t) for t in degrees],
        [p[2] * 1e3 for p in parts],
        bottom=[p[1] * 1e3 for p in parts],
        color="tab:red",
        label="2 all-reduces (on the critical path)",
    )
    for i, (_, c, a) in enumerate(parts):
        ax_t.text(i, (c + a) * 1e3, f"{a / (c + a):.0%}", ha="center", va="bottom", fontsize=8)
    ax_t.set(xlabel="tensor-parallel degree t", ylabel="ms per block per step", title=f"predicted on {hw.name}")
    for ax in (ax_v, ax_t):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    caption = (
        f"B={batch}, S={seq}, H={hidden}, t={tp_size}, {dtype}: {vol['step_payload_bytes'] / 1e6:.3g} MB "
        f"all-reduced per block per step (each rank sends {vol['per_rank_bytes'] / 1e6:.3g} MB); on "
        f"{hw.name} that takes {comm * 1e3:.3g} ms against {compute * 1e3:.3g} ms of GEMMs "
        f"({comm / (comm + compute):.0%} of the block's time)."
    )
    return fig, caption


def tp_explorer(measured=None, batch: int = 8, seq: int = 128, hidden: int = 1024):
    """Batch, sequence, hidden size, t, dtype and hardware -> all-reduce volume and its share of a block's time;
    ``measured`` (the lesson's volume table) is marked; ``batch``, ``seq``, ``hidden`` set where the sliders start."""
    import ipywidgets as W

    def options(values, value):
        return sorted(set(values) | {value})

    controls = dict(
        batch=W.SelectionSlider(options=options([1, 2, 4, 8, 16, 32], batch), value=batch, description="batch B"),
        seq=W.SelectionSlider(options=options([2**i for i in range(5, 13)], seq), value=seq, description="seq S"),
        hidden=W.SelectionSlider(
            options=options([256, 512, 1024, 2048, 4096, 8192], hidden), value=hidden, description="hidden H"
        ),
        tp_size=W.SelectionSlider(options=[2, 4, 8], value=2, description="t"),
        hardware=_preset_dropdown(),
        dtype=W.Dropdown(options=["fp32", "bf16"], description="dtype"),
    )
    return _wire(controls, lambda **v: tp_figure(measured=measured, **v))
