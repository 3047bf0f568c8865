"""Plots the lessons share: speedup and efficiency over world sizes, per-rank Gantt timelines.

Every function takes the table it plots (a pandas DataFrame from ``simlib.lessons.scaling`` or
``simlib.timeline``) and an optional matplotlib ``ax``; it returns the ``ax`` so a notebook can add to it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "comm": "#55A868",
    "optimizer": "#8172B3",
    "wait": "#C44E52",
    "other": "#937860",
    "step": "#BBBBBB",
}


def _ax(ax, figsize=(6, 4)):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def integer_ticks(ax, which: str = "x"):
    """Ticks at whole numbers only on the named axes (``"x"``, ``"y"`` or ``"xy"``) of ``ax``: for an axis that
    counts (ranks, experts, degrees, micro-batches), where matplotlib's default locator would put ticks at -0.5,
    0.25, ... Returns ``ax``."""
    from matplotlib.ticker import MaxNLocator

    for name in which:
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    return ax


def _mark_oversubscribed(ax, table, cores):
    """Shade the world sizes above the core count: there the workers share cores."""
    if cores is None:
        return
    over = table[table["world_size"] > cores]["world_size"]
    if len(over):
        ax.axvspan(
            cores + 0.5,
            table["world_size"].max() + 0.5,
            color="#F2D7D5",
            alpha=0.6,
            zorder=0,
            label=f"world size > {cores} cores (oversubscribed)",
        )


def speedup(table, ax=None, cores=None, label="measured", title=None):
    """Speedup against world size with the ideal line, error bars from the step-time spread.

    ``table`` has ``world_size`` and ``speedup`` (and optionally ``speedup_lo``/``speedup_hi``);
    rows with ``baseline`` set (e.g. one process using every core) are drawn as horizontal lines.
    """
    ax = _ax(ax)
    cores = table.attrs.get("cores") if cores is None else cores
    runs = table[table["baseline"].isna()] if "baseline" in table else table
    _mark_oversubscribed(ax, runs, cores)
    sizes = runs["world_size"].to_numpy()
    ax.plot(sizes, sizes, "--", color="gray", label="ideal (linear)")
    if {"speedup_lo", "speedup_hi"} <= set(runs.columns):
        err = [runs["speedup"] - runs["speedup_lo"], runs["speedup_hi"] - runs["speedup"]]
        ax.errorbar(sizes, runs["speedup"], yerr=err, marker="o", capsize=3, label=label)
    else:
        ax.plot(sizes, runs["speedup"], marker="o", label=label)
    if "baseline" in table:
        for _, row in table[table["baseline"].notna()].iterrows():
            ax.axhline(
                row["speedup"], color="#C44E52", linestyle=":", label=f"{row['baseline']}: {row['speedup']:.2f}x"
            )
    ax.set_xlabel("world size (processes)")
    ax.set_ylabel("speedup over 1 process")
    ax.set_xticks(sizes)
    ax.set_title(title or f"{table.attrs.get('mode', '')} scaling".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def efficiency(table, ax=None, cores=None, title=None):
    """Parallel efficiency (speedup per core used: processes x threads) and communication fraction."""
    ax = _ax(ax)
    cores = table.attrs.get("cores") if cores is None else cores
    runs = table[table["baseline"].isna()] if "baseline" in table else table
    _mark_oversubscribed(ax, runs, cores)
    sizes = runs["world_size"].to_numpy()
    ax.plot(sizes, runs["efficiency"], marker="o", label="efficiency")
    if "comm_fraction" in runs:
        ax.plot(sizes, runs["comm_fraction"], marker="s", label="communication fraction of a step")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_ylim(0, max(1.1, float(runs["efficiency"].max()) * 1.1))
    ax.set_xticks(sizes)
    ax.set_xlabel("world size (processes)")
    ax.set_ylabel("fraction")
    ax.set_title(title or "efficiency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def gantt(df, ax=None, step=None, title=None, kinds=None, label_spans=False):
    """Per-rank timeline of spans (one row per rank, one colour per kind), times in milliseconds.

    ``df`` has the timeline columns (rank, step, kind, name, start, end, duration); ``step`` picks one step
    (default: the first step after warm-up, or all spans if there are no steps). Step spans are drawn as a
    thin grey bar under the others.
    """
    ax = _ax(ax, figsize=(9, 0.6 + 0.55 * max(1, df["rank"].nunique())))
    data = df
    if step is None and "step" in df and (df["step"] >= 0).any():
        measured = df[(df["step"] >= 0) & (~df["warmup"].astype(bool))] if "warmup" in df else df[df["step"] >= 0]
        step = int(measured["step"].min()) if len(measured) else None
    if step is not None:
        data = df[df["step"] == step]
    if not len(data):
        raise ValueError(f"no spans to draw for step {step}")
    t0 = data["start"].min()
    ranks = sorted(data["rank"].unique())
    seen = set()
    for _, row in data.iterrows():
        kind = row["kind"]
        if kinds is not None and kind not in kinds and kind != "step":
            continue
        y = ranks.index(row["rank"])
        start, width = (row["start"] - t0) * 1e3, row["duration"] * 1e3
        if kind == "step":
            ax.barh(y - 0.38, width, left=start, height=0.08, color=COLORS["step"])
            continue
        lab = kind if kind not in seen else None
        seen.add(kind)
        ax.barh(
            y,
            width,
            left=start,
            height=0.6,
            color=COLORS.get(kind, COLORS["other"]),
            edgecolor="white",
            linewidth=0.5,
            label=lab,
        )
        if label_spans and width > 0:
            ax.text(start + width / 2, y, str(row["name"]), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or ("timeline" + (f", step {step}" if step is not None else "")))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(axis="x", alpha=0.3)
    return ax


def scaling_figure(table, path=None):
    """Speedup and efficiency side by side; saved to ``path`` (PNG) when given."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    speedup(table, ax=axes[0])
    efficiency(table, ax=axes[1])
    note = table.attrs.get("placement_note")  # where the ranks ran, when it needs saying (lessons.scaling.placement)
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# ---- simulator (lesson 06) ----
def predicted_vs_measured(table, ax=None, title=None):
    """Scatter of predicted against measured step time (ms) with the y = x line and a ±15 % band.

    ``table`` has columns ``predicted``, ``measured`` (seconds) and ``config`` (as from
    ``simlib.sim.validate.validation_table``); the title gives the median absolute error.
    """
    import numpy as np

    ax = _ax(ax, figsize=(5.5, 5))
    meas, pred = table["measured"].to_numpy() * 1e3, table["predicted"].to_numpy() * 1e3
    hi = 1.15 * max(meas.max(), pred.max())
    line = np.linspace(0, hi, 50)
    ax.plot(line, line, "k-", lw=1, label="predicted = measured")
    ax.fill_between(line, 0.85 * line, 1.15 * line, color="tab:green", alpha=0.15, label="±15 %")
    worlds = table["world_size"] if "world_size" in table else np.ones(len(table))
    for w in sorted(set(worlds)):
        sel = np.asarray(worlds == w)
        ax.scatter(meas[sel], pred[sel], s=40, label=f"world size {w}", zorder=3)
    err = float(np.median(np.abs(pred / meas - 1)))
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title or f"median absolute error {err:.0%}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


# ---- collectives and data parallelism (lessons 01-03) ----
def collective_grid(demos, title=None):
    """What each rank holds before and after each collective: one row per collective, a box per value.

    ``demos`` maps a collective's name to the per-rank dicts of ``simlib.collectives.collective_demo``.
    """

    ops = list(demos)
    fig, axes = plt.subplots(
        len(ops), 2, figsize=(10, 1.0 + 1.05 * len(ops) * max(len(d) for d in demos.values()) / 2), squeeze=False
    )
    cmap = plt.get_cmap("tab10")
    for row, op in enumerate(ops):
        for col, key in enumerate(("before", "after")):
            ax = axes[row][col]
            per_rank = demos[op]
            for r, d in enumerate(per_rank):
                values = d[key]
                if values is None:
                    ax.text(0, r, "(undefined)", va="center", fontsize=8, color="gray")
                    continue
                for i, v in enumerate(values):
                    source = int(v) // 10 if float(v).is_integer() and key == "before" else None
                    color = cmap(source) if source is not None else "#DDDDDD"
                    ax.add_patch(plt.Rectangle((i - 0.45, r - 0.4), 0.9, 0.8, color=color, alpha=0.35))
                    ax.text(i, r, f"{v:g}", ha="center", va="center", fontsize=8)
            width = max(len(d[key] or []) for d in per_rank)
            ax.set_xlim(-0.6, max(width, 1) - 0.4)
            ax.set_ylim(len(per_rank) - 0.5, -0.5)
            ax.set_yticks(range(len(per_rank)))
            ax.set_yticklabels([f"rank {r}" for r in range(len(per_rank))], fontsize=8)
            ax.set_xticks([])
            ax.set_title(f"{op}: {key}", fontsize=9)
            for side in ("top", "right", "bottom"):
                ax.spines[side].set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def bandwidth(rows, fits=None, ax=None, kind="time", title=None):
    """Collective time (``kind="time"``) or bus bandwidth (``"busbw"``) against message size, per op and world.

    ``rows`` as from ``simlib.collectives.bandwidth_sweep``; ``fits`` maps world_size to an
    ``fit_alpha_beta`` dict, drawn as the alpha-beta model line.
    """
    import numpy as np
    import pandas as pd

    from .collectives import alpha_beta_time

    ax = _ax(ax, figsize=(6.5, 4.2))
    df = pd.DataFrame(rows)
    for (op, world), part in df.groupby(["op", "world_size"]):
        part = part.sort_values("bytes")
        y = part["time"] * 1e3 if kind == "time" else part["busbw"] / 1e9
        (line,) = ax.plot(part["bytes"], y, marker="o", ms=4, label=f"{op}, {world} ranks")
        if kind == "time":
            ax.fill_between(
                part["bytes"], part["time_q1"] * 1e3, part["time_q3"] * 1e3, alpha=0.2, color=line.get_color()
            )
    for world, fit in (fits or {}).items():
        sizes = np.logspace(np.log10(df["bytes"].min()), np.log10(df["bytes"].max()), 50)
        model = alpha_beta_time(sizes, world, fit["alpha"], fit["beta"])
        y = model * 1e3 if kind == "time" else sizes / model * 2 * (world - 1) / world / 1e9
        ax.plot(
            sizes,
            y,
            "k--" if world == 2 else "k:",
            lw=1,
            label=f"α-β model, {world} ranks: α={fit['alpha'] * 1e6:.0f} µs, 1/β={fit['bandwidth'] / 1e9:.2f} GB/s",
        )
    ax.set_xscale("log")
    ax.set_yscale("log" if kind == "time" else "linear")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (ms)" if kind == "time" else "bus bandwidth (GB/s)")
    ax.set_title(title or ("all-reduce time" if kind == "time" else "bus bandwidth"))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return ax
