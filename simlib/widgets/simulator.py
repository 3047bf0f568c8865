"""The explorer of lesson 09c: the simulator's prediction, explained and drawn."""

from __future__ import annotations


def explain(model, hardware, strategy) -> str:
    """One prediction as a few lines of text (also what the explorer prints)."""
    from ..sim import predict

    try:
        p = predict(model, hardware, strategy)
    except ValueError as exc:
        return f"not a valid configuration: {exc}"
    mem = p.memory["total"] / 1e9
    where = f"{model.name} on {strategy.world_size} x {hardware.name}"
    if not p.fits:  # it would not run: no step time or throughput to report
        return (
            f"{where}: does NOT fit — {mem:.1f} GB per device of {hardware.memory_bytes / 1e9:.0f} GB "
            f"(90 % usable); no throughput. Try ZeRO, more tp/pp, recomputation or a smaller micro-batch."
        )
    return (
        f"{where}: step {p.step_time:.3g} s "
        f"(compute {p.compute:.3g}, exposed comm {p.exposed_comm:.3g}, bubble {p.bubble:.3g}), "
        f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.0%}; memory {mem:.1f} GB per device: fits"
    )


def explorer_view(model, hardware, strategy):
    """What the explorer shows for one configuration: (text, prediction or None).

    None means draw nothing: the plan is impossible (tensor parallelism across nodes, layers that do not split,
    ...), and the text says why. A plan that does not fit still returns its prediction (the memory chart shows
    why) but its text reports no throughput."""
    from ..sim import predict

    try:
        strategy = strategy.validate(model=model, hardware=hardware)
        p = predict(model, hardware, strategy)
    except ValueError as exc:
        return f"<b>not a valid configuration:</b> {exc}", None
    return explain(model, hardware, strategy), p


def draw_prediction(model, hardware, strategy, axes=None):
    """Two bar charts: where the step time goes, and what fills each device's memory. A plan that does not fit
    gets the memory chart only (a step time for a job that cannot run would mislead)."""
    import matplotlib.pyplot as plt

    from ..sim import predict

    p = predict(model, hardware, strategy)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    ax_t, ax_m = axes
    if p.fits:
        parts = {"compute": p.compute, "exposed comm": p.exposed_comm, "bubble": p.bubble, "optimizer": p.optimizer}
        left = 0.0
        for (name, value), color in zip(parts.items(), ["tab:blue", "tab:red", "tab:gray", "tab:green"]):
            ax_t.barh([0], [value], left=left, color=color, label=name)
            left += value
        ax_t.set_xlabel("seconds per step")
        ax_t.set_title(f"step {p.step_time:.3g} s, MFU {p.mfu:.0%}")
        ax_t.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8)
    else:
        ax_t.text(
            0.5,
            0.5,
            "does not fit in memory:\nno step time, no throughput",
            ha="center",
            va="center",
            transform=ax_t.transAxes,
        )
        ax_t.set_xticks([])
    ax_t.set_yticks([])
    left = 0.0
    for name, color in zip(
        ["weights", "gradients", "optimizer", "activations"], ["tab:blue", "tab:orange", "tab:purple", "tab:olive"]
    ):
        value = p.memory[name] / 1e9
        ax_m.barh([0], [value], left=left, color=color, label=name)
        left += value
    ax_m.axvline(hardware.memory_bytes / 1e9, color="k", ls="--", label="device memory")
    ax_m.set_yticks([])
    ax_m.set_xlabel("GB per device")
    ax_m.set_title("fits" if p.fits else "does not fit")
    ax_m.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5, fontsize=8)
    return p


def simulator_explorer(hardware_presets=None, model_sizes=None):
    """Sliders -> live prediction. Returns the widget box (display it, or leave it last in a cell).

    Every change clears the plot first: an impossible plan (tensor parallelism across nodes, layers that do not
    split into the stages) shows only the reason, never the previous configuration's chart."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    from .. import sim

    hardware_presets = hardware_presets or {"DGX A100 80GB": sim.dgx_a100(), "DGX H100": sim.dgx_h100()}
    model_sizes = model_sizes or {label: sim.gpt_size(label) for label in sim.GPT_SIZES}
    powers = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    controls = dict(
        hw=W.Dropdown(options=list(hardware_presets), description="hardware"),
        size=W.Dropdown(options=list(model_sizes), value=list(model_sizes)[1], description="model"),
        dp=W.SelectionSlider(options=powers, value=8, description="dp"),
        tp=W.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="tp"),
        pp=W.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="pp"),
        micro_batch=W.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="micro-batch"),
        num_micro_batches=W.SelectionSlider(options=powers[:8], value=8, description="micro-batches"),
        zero=W.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage"),
        recompute=W.Dropdown(options=["none", "selective", "full"], value="selective", description="recompute"),
    )
    text = W.HTML()
    out = W.Output()

    def redraw(_=None):
        v = {k: c.value for k, c in controls.items()}
        model, hardware = model_sizes[v["size"]], hardware_presets[v["hw"]]
        try:
            strategy = sim.Strategy(
                dp=v["dp"],
                tp=v["tp"],
                pp=v["pp"],
                micro_batch=v["micro_batch"],
                num_micro_batches=v["num_micro_batches"],
                zero_stage=v["zero"],
                recompute=v["recompute"],
                overlap=True,
            )
            caption, prediction = explorer_view(model, hardware, strategy)
        except ValueError as exc:
            caption, prediction = f"<b>not a valid configuration:</b> {exc}", None
        if prediction is None:
            out.clear_output()  # at once: an impossible plan leaves no stale chart behind
            text.value = caption
            return
        with out:
            out.clear_output(wait=True)  # the old chart stays until the new one replaces it (no flicker)
            draw_prediction(model, hardware, strategy)
            plt.tight_layout()
            plt.show()
        text.value = caption  # after the chart: when the text changes, the chart already has

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    grid = W.GridBox(list(controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
    return W.VBox([grid, text, out])
