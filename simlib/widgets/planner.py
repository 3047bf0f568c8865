"""The explorer of lesson 13: move the constraints (model, devices, batch, sequence, memory) and watch the
planner's ranking change. Every number comes from ``simlib.sim.plan``."""

from __future__ import annotations

from ._common import _figure

TERM_COLORS = {
    "compute": "tab:blue",
    "recompute": "tab:cyan",
    "bubble": "tab:red",
    "tp_comm": "tab:orange",
    "pp_comm": "tab:pink",
    "dp_exposed": "tab:purple",
    "embedding_sync": "tab:brown",
    "optimizer": "tab:gray",
}


def planner_figure(
    model="70B",
    cluster="h100",
    nodes: int = 16,
    global_batch: int = 256,
    seq_len=None,
    memory_gb=None,
    top: int = 10,
    measured=None,
    result=None,
    space=None,
):
    """(figure, caption): the ``top`` plans as stacked bars of where their step goes, and every plan's step time
    against its memory per device (those over the limit in grey). ``measured``: rows {"predicted_step_s",
    "measured_step_s", "plan"} from this machine, drawn as a third panel. ``result``: an existing search."""
    from ..sim import plan
    from ..sim.planner_report import terms

    if result is None:
        result = plan(
            model,
            cluster,
            nodes=nodes,
            global_batch=global_batch,
            seq_len=seq_len,
            memory_limit=None if memory_gb is None else memory_gb * 1e9,
            space=space,
        )
    if not result.ranked:
        raise ValueError(result.nothing_fits())
    fig, axes = _figure(3 if measured else 2, figsize=(15 if measured else 12, 4.2))
    ax = axes[0]
    shown = result.ranked[:top][::-1]
    for y, entry in enumerate(shown):
        left = 0.0
        for k, v in terms(result, entry).items():
            ax.barh(y, v, left=left, color=TERM_COLORS[k], label=k if y == 0 else None)
            left += v
    from ..sim.planner import label

    ax.set_yticks(range(len(shown)), [label(e["strategy"]) for e in shown], fontsize=7)
    ax.set_xlabel("predicted seconds per step")
    ax.set_title(
        f"top {len(shown)} of {result.extra.get('priced', len(result.ranked)):,} plans priced that fit"
        + (f" ({result.pruned:,} skipped by the bound)" if result.pruned else ""),
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    ax = axes[1]
    big = result.too_big[:: max(1, len(result.too_big) // 3000)]
    if big:
        from ..sim.planner_report import pricer_of

        pricer = pricer_of(result)
        big = [r for r in big if r["memory"]["total"] < 3 * result.memory_limit] or big
        xs = [r["memory"]["total"] / 1e9 for r in big[:400]]
        ys = [pricer.price(r["strategy"], result.global_batch)["step_time"] for r in big[:400]]
        ax.scatter(xs, ys, s=6, c="lightgray", label=f"over the limit ({len(result.too_big):,})")
    fit = result.ranked[:: max(1, len(result.ranked) // 3000)]
    ax.scatter(
        [r["memory"]["total"] / 1e9 for r in fit],
        [r["step_time"] for r in fit],
        s=6,
        c="tab:blue",
        label=f"fit ({len(result.ranked):,})",
    )
    best = result.best
    ax.scatter([best["memory"]["total"] / 1e9], [best["step_time"]], s=80, marker="*", c="red", label="best")
    ax.axvline(result.memory_limit / 1e9, color="k", ls="--", lw=1, label="memory limit")
    ax.set_xlabel("GB per device")
    ax.set_ylabel("predicted seconds per step")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"{result.model.name} on {result.world_size} x {result.hardware.name}", fontsize=10)
    if measured:
        ax = axes[2]
        xs = [r["predicted_step_s"] * 1e3 for r in measured]
        ys = [r["measured_step_s"] * 1e3 for r in measured]
        ax.scatter(xs, ys)
        for r, x, y in zip(measured, xs, ys):
            ax.annotate(r["plan"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = measured")
        ax.set_xlabel("predicted ms per step")
        ax.set_ylabel("measured ms per step (this machine)")
        ax.legend(fontsize=7)
        ax.set_title("the proof here", fontsize=10)
    fig.tight_layout()
    from ..sim.planner_uncertainty import interval, plausibility, ties

    band = interval(result, best)
    sure = (
        f"80 % interval {band['low']:.3g}–{band['high']:.3g} s: {len(ties(result))} of the plans shown tie with it"
        if band["high"] is not None
        else f"no interval ({band['basis']})"
    )
    flag = plausibility(result, best)
    caption = (
        f"best: <b>{label(best['strategy'])}</b>, {best['step_time']:.3g} s per step ({sure}), "
        f"{best['tokens_per_s']:,.0f} tokens/s, MFU {best['mfu']:.0%}, {best['memory']['total'] / 1e9:.1f} "
        f"GB per device; {result.considered:,} combinations searched in {result.seconds:.1f} s"
        + (f"<br><b>{flag}</b>" if flag else "")
    )
    return fig, caption


def cached_search(model, cluster, nodes, global_batch, seq_len, memory_gb, space=None, top: int = 10):
    """The bounded search (``sim.plan(..., top=top)``: layouts visited by a lower bound on their step, stopped past
    the ``top``-th; the same top plans as the full search) for these settings, kept for the session with the
    pricer of its model and machine (:mod:`simlib.sim.fast_search`: a later setting reuses what it priced)."""
    from ..sim.fast_search import SEARCHES

    return SEARCHES.get(model, cluster, nodes, global_batch, seq_len, memory_gb, space=space, top=top)


def planner_explorer(measured=None, space=None, prefetch: bool = True):
    """Controls: model, preset, nodes, global batch, sequence length, memory limit -> the ranking, redrawn.
    ``space``: narrows every search (``sim.plan``'s argument); ``measured``: this machine's rows, a third panel.
    Each setting is searched once (:func:`cached_search`, bounded to the top 10); the panel of every plan then
    shows the top plans and those over the memory limit, not every plan that fits. ``prefetch``: after each
    redraw, the settings one step away on each slider (then the other models) are searched in the background,
    stopped whenever a redraw wants the CPU (:meth:`simlib.sim.fast_search.Searches.prefetch`)."""
    import ipywidgets as W

    from ..sim.fast_search import SEARCHES, neighbours
    from ._common import _preset_dropdown, _wire

    hardware = _preset_dropdown()
    hardware.value = "h100"
    controls = dict(
        model=W.Dropdown(options=["8B", "70B", "405B", "llama2-7b", "llama2-70b"], value="70B", description="model"),
        cluster=hardware,
        nodes=W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128], value=4, description="nodes"),
        global_batch=W.SelectionSlider(options=[64, 128, 256, 512, 1024, 2048], value=256, description="global batch"),
        seq_len=W.SelectionSlider(options=[2048, 4096, 8192, 16384, 32768], value=8192, description="sequence"),
        memory_gb=W.SelectionSlider(options=[16, 24, 40, 60, 72, 80, 120], value=72, description="GB limit"),
    )
    sliders = {k: controls[k].options for k in ("nodes", "global_batch", "seq_len", "memory_gb")}
    sliders = {k: [o[1] if isinstance(o, tuple) else o for o in v] for k, v in sliders.items()}
    models = list(controls["model"].options)

    def draw(**values):
        try:
            with SEARCHES.paused():  # the background searches wait while this redraw runs
                return planner_figure(measured=measured, result=cached_search(space=space, **values))
        finally:
            if prefetch:  # the next moves: one step on each slider, then the other models here
                ahead = neighbours(values, sliders) + [{**values, "model": m} for m in models if m != values["model"]]
                SEARCHES.prefetch([_setting(v, space) for v in ahead])

    _stop_ahead_when_a_cell_runs(SEARCHES)
    box = _wire(controls, draw)
    box.searches = SEARCHES  # for tests and benchmarks: wait() for the background searches
    return box


def _stop_ahead_when_a_cell_runs(searches):
    """In a notebook, the background searches run only while the kernel is idle: a cell that starts drops them."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or getattr(searches, "_cell_hook", False):
        return
    shell.events.register("pre_run_cell", lambda *_: searches.cancel())
    searches._cell_hook = True


def _setting(values: dict, space) -> tuple:
    """:meth:`Searches.get`'s arguments for the explorer's ``values``."""
    return tuple(values[k] for k in ("model", "cluster", "nodes", "global_batch", "seq_len", "memory_gb")) + (
        space,
        10,
    )
