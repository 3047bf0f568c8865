"""The explorer of lesson 01: the ring, step by step; the α–β model."""

from __future__ import annotations

import numpy as np

from ._common import _figure, _log_slider, _wire


def ring_trace(world_size: int) -> list[dict]:
    """Every state of a ring all-reduce on ``world_size`` ranks, from the chunk indices the real ring uses.

    State ``i``: ``phase`` ("start", "reduce_scatter", "all_gather"), ``step``, ``holds[r][c]`` (the ranks whose
    chunk ``c`` rank ``r``'s copy of chunk ``c`` now sums), ``sends`` [(src, dst, chunk)] of the step that led
    here, and ``sent`` (chunks each rank has sent so far). Raises ValueError for world_size < 2.
    """
    from ..collectives import ring_chunks, ring_neighbors

    n = world_size
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"a ring needs world_size >= 2, got {n!r}")
    holds = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [dict(phase="start", step=0, holds=holds, sends=[], sent=0)]
    sent = 0
    for phase in ("reduce_scatter", "all_gather"):
        for step in range(n - 1):
            new = [row[:] for row in holds]
            sends = []
            for r in range(n):
                _, right = ring_neighbors(r, n)
                chunk, _ = ring_chunks(phase, r, n, step)
                if ring_chunks(phase, right, n, step)[1] != chunk:
                    raise RuntimeError(f"ring_chunks disagree: rank {r} sends {chunk}, rank {right} expects another")
                sends.append((r, right, chunk))
                new[right][chunk] = (
                    holds[right][chunk] | holds[r][chunk] if phase == "reduce_scatter" else holds[r][chunk]
                )
            holds, sent = new, sent + 1
            states.append(dict(phase=phase, step=step, holds=holds, sends=sends, sent=sent))
    return states


def ring_figure(world_size: int, index: int):
    """State ``index`` of :func:`ring_trace` as a rank x chunk grid; returns (figure, caption)."""
    import matplotlib.pyplot as plt

    states = ring_trace(world_size)
    if not 0 <= index < len(states):
        raise ValueError(f"step index must be in 0..{len(states) - 1}, got {index}")
    st, n = states[index], world_size
    fig, ax = plt.subplots(figsize=(1.3 * n + 3, 0.75 * n + 1.2))
    full = np.array([[len(st["holds"][r][c]) / n for c in range(n)] for r in range(n)])
    ax.imshow(full, cmap="Blues", vmin=0, vmax=1.4, aspect="auto")
    sending = {(src, chunk) for src, _, chunk in st["sends"]}
    receiving = {(dst, chunk) for _, dst, chunk in st["sends"]}
    for r in range(n):
        for c in range(n):
            who = sorted(st["holds"][r][c])
            label = "all" if len(who) == n else "+".join(f"x{w}" for w in who)
            ax.text(c, r, label, ha="center", va="center", fontsize=9, color="k")
            if (r, c) in receiving:
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="tab:red", lw=2.5))
            if (r, c) in sending:
                ax.add_patch(
                    plt.Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, fill=False, ec="tab:orange", lw=1.5, ls="--")
                )
    ax.set_xticks(range(n), [f"chunk {c}" for c in range(n)])
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    phase = {
        "start": "before the first step",
        "reduce_scatter": f"reduce-scatter, step {st['step'] + 1} of {n - 1}",
        "all_gather": f"all-gather, step {st['step'] + 1} of {n - 1}",
    }[st["phase"]]
    ax.set_title(f"ring all-reduce on {n} ranks: {phase}")
    fig.tight_layout()
    moves = ", ".join(f"{s}→{d}: chunk {c}" for s, d, c in st["sends"])
    caption = (
        f"{phase}. "
        + (f"Dashed orange: sent, red: received ({moves}). " if moves else "")
        + f"Each rank has sent {st['sent']} chunk(s) = {st['sent']}/{n} of the tensor "
        f"(all-reduce total: {2 * (n - 1)}/{n}). 'x0+x1' = the sum of rank 0's and rank 1's values."
    )
    return fig, caption


def ring_explorer(max_world_size: int = 8):
    """Ranks and a step slider -> which chunk each rank sends, and what each rank holds."""
    import ipywidgets as W

    ranks = W.IntSlider(value=4, min=2, max=max_world_size, description="ranks")
    step = W.IntSlider(value=0, min=0, max=2 * (ranks.value - 1), description="step")
    ranks.observe(lambda change: setattr(step, "max", 2 * (change["new"] - 1)), names="value")
    return _wire(dict(world_size=ranks, index=step), ring_figure, columns=2)


def alpha_beta_figure(size_bytes: float, world_size: int, alpha: float, bandwidth: float, measured=None):
    """Ring all-reduce time and bus bandwidth against message size in the α–β model; returns (figure, caption).

    ``alpha`` (s per message) and ``bandwidth`` (1/β, bytes/s) as :func:`simlib.collectives.fit_alpha_beta` gives
    them; ``measured``: rows of :func:`simlib.collectives.bandwidth_sweep` (those of ``world_size`` are marked).
    """
    from ..collectives import alpha_beta_time, bus_factor

    if size_bytes <= 0 or alpha < 0 or bandwidth <= 0 or world_size < 2:
        raise ValueError("size and bandwidth must be > 0, alpha >= 0, ranks >= 2")
    n, beta = world_size, 1.0 / bandwidth
    sizes = np.geomspace(2**10, 2**30, 121)
    times = alpha_beta_time(sizes, n, alpha, beta)
    busbw = sizes / times * bus_factor("all_reduce", n)
    fig, (ax_t, ax_b) = _figure()
    ax_t.loglog(sizes, times * 1e3, "k-", label=f"α–β model, {n} ranks")
    ax_b.semilogx(sizes, busbw / 1e9, "k-", label="α–β model")
    for op, marker in (("all_reduce", "o"), ("ring_all_reduce", "s")):
        rows = [r for r in (measured or []) if r["op"] == op and r["world_size"] == n]
        if rows:
            ax_t.loglog(
                [r["bytes"] for r in rows], [r["time"] * 1e3 for r in rows], marker, alpha=0.7, label=f"measured {op}"
            )
            ax_b.semilogx(
                [r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], marker, alpha=0.7, label=f"measured {op}"
            )
    t = float(alpha_beta_time(size_bytes, n, alpha, beta))
    bw = size_bytes / t * bus_factor("all_reduce", n)
    ax_t.plot([size_bytes], [t * 1e3], "r*", ms=14, label="your message")
    ax_b.plot([size_bytes], [bw / 1e9], "r*", ms=14)
    ax_t.axvline(alpha * bandwidth * n, color="gray", ls=":", label="latency = bandwidth term")
    ax_t.set(xlabel="message size (bytes)", ylabel="time (ms)", title="all-reduce time")
    ax_b.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)", title="bus bandwidth = S/T · 2(n−1)/n")
    for ax in (ax_t, ax_b):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    latency = 2 * (n - 1) * alpha
    caption = (
        f"{size_bytes / 2**20:.3g} MB on {n} ranks: {t * 1e3:.3g} ms = latency {latency * 1e3:.3g} ms "
        f"({latency / t:.0%}) + bytes {(t - latency) * 1e3:.3g} ms; bus bandwidth {bw / 1e9:.3g} GB/s "
        f"of the link's {bandwidth / 1e9:.3g}."
    )
    return fig, caption


def alpha_beta_explorer(measured=None, fits=None):
    """Message size, ranks, α and bandwidth -> time and bus bandwidth; ``fits`` {n: fit_alpha_beta(...)} seeds
    α and bandwidth with what the lesson measured, ``measured`` (sweep rows) marks the measured points."""
    import ipywidgets as W

    fit = (fits or {}).get(2) or next(iter((fits or {}).values()), None) or dict(alpha=1e-3, bandwidth=0.7e9)
    controls = dict(
        size_bytes=_log_slider("size (B)", 2**20, 2**10, 2**30, "{:.3g}"),
        world_size=W.IntSlider(value=2, min=2, max=64, description="ranks"),
        alpha=_log_slider("α (s)", max(fit["alpha"], 1e-7), 1e-7, 1e-2),
        bandwidth=_log_slider("1/β (B/s)", fit["bandwidth"], 1e8, 1e12),
    )
    return _wire(controls, lambda **v: alpha_beta_figure(measured=measured, **v), columns=2, width="400px")
