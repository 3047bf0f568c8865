"""ipywidgets explorers for the lessons.

``simulator_explorer()``: sliders for the parallel degrees, micro-batches, model size and hardware preset; each
change redraws the simulator's prediction (step-time breakdown and memory per device) live.
"""
from __future__ import annotations


def explain(model, hardware, strategy) -> str:
    """One prediction as a few lines of text (also what the explorer prints)."""
    from .sim import predict

    try:
        p = predict(model, hardware, strategy)
    except ValueError as exc:
        return f"not a valid configuration: {exc}"
    mem = p.memory["total"] / 1e9
    fits = "fits" if p.fits else f"does NOT fit ({hardware.memory_bytes / 1e9:.0f} GB per device)"
    return (f"{model.name} on {strategy.world_size} x {hardware.name}: step {p.step_time:.3g} s "
            f"(compute {p.compute:.3g}, exposed comm {p.exposed_comm:.3g}, bubble {p.bubble:.3g}), "
            f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.0%}; memory {mem:.1f} GB per device: {fits}")


def draw_prediction(model, hardware, strategy, axes=None):
    """Two bar charts: where the step time goes, and what fills each device's memory."""
    import matplotlib.pyplot as plt

    from .sim import predict

    p = predict(model, hardware, strategy)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    ax_t, ax_m = axes
    parts = {"compute": p.compute, "exposed comm": p.exposed_comm, "bubble": p.bubble, "optimizer": p.optimizer}
    left = 0.0
    for (name, value), color in zip(parts.items(), ["tab:blue", "tab:red", "tab:gray", "tab:green"]):
        ax_t.barh([0], [value], left=left, color=color, label=name)
        left += value
    ax_t.set_yticks([])
    ax_t.set_xlabel("seconds per step")
    ax_t.set_title(f"step {p.step_time:.3g} s, MFU {p.mfu:.0%}")
    ax_t.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8)
    left = 0.0
    for name, color in zip(["weights", "gradients", "optimizer", "activations"],
                           ["tab:blue", "tab:orange", "tab:purple", "tab:olive"]):
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
    """Sliders -> live prediction. Returns the widget box (display it, or leave it last in a cell)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    from . import sim

    hardware_presets = hardware_presets or {"DGX A100 80GB": sim.dgx_a100(), "DGX H100": sim.dgx_h100()}
    model_sizes = model_sizes or {label: sim.gpt_size(label) for label in sim.GPT_SIZES}
    powers = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    controls = dict(
        hw=W.Dropdown(options=list(hardware_presets), description="hardware"),
        size=W.Dropdown(options=list(model_sizes), value=list(model_sizes)[1], description="model"),
        dp=W.SelectionSlider(options=powers, value=8, description="dp"),
        tp=W.SelectionSlider(options=[1, 2, 4, 8], value=1, description="tp"),
        pp=W.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="pp"),
        micro_batch=W.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="micro-batch"),
        num_micro_batches=W.SelectionSlider(options=powers[:8], value=8, description="micro-batches"),
        zero=W.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage"),
        recompute=W.Dropdown(options=["none", "selective", "full"], value="selective", description="recompute"),
    )
    text = W.HTML()

    def redraw(hw, size, dp, tp, pp, micro_batch, num_micro_batches, zero, recompute):
        model, hardware = model_sizes[size], hardware_presets[hw]
        try:
            strategy = sim.Strategy(dp=dp, tp=tp, pp=pp, micro_batch=micro_batch,
                                    num_micro_batches=num_micro_batches, zero_stage=zero, recompute=recompute,
                                    overlap=True).validate(model=model, hardware=hardware)
        except ValueError as exc:
            text.value = f"<b>not a valid configuration:</b> {exc}"
            return
        text.value = explain(model, hardware, strategy)
        draw_prediction(model, hardware, strategy)
        plt.tight_layout()
        plt.show()

    out = W.interactive_output(redraw, controls)
    grid = W.GridBox(list(controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
    return W.VBox([grid, text, out])


STATE_COLORS = {"weights": "tab:blue", "gradients": "tab:orange", "optimizer": "tab:purple", "activations": "tab:olive"}


def draw_memory(model, dp: int, zero_stage: int, recompute: str = "none", precision: str = "bf16",
                micro_batch: int = 1, measured=None, ax=None):
    """Stacked bar of bytes per device for ZeRO stages 0-3 (the chosen one outlined), from ``simlib.sim.memory``.

    ``measured``: rows {"zero_stage", "dp", "weights", "gradients", "optimizer"} (bytes) from this run, drawn as
    black markers on the bars they belong to (same stage, same dp).
    """
    import matplotlib.pyplot as plt

    from .sim import Strategy, memory_per_device

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    unit, label = (1e9, "GB") if model.params > 1e8 else (1e6, "MB")
    for stage in range(4):
        mem = memory_per_device(model, Strategy(dp=dp, zero_stage=stage, recompute=recompute, dtype=precision,
                                                micro_batch=micro_batch, optimizer="adam"))
        bottom = 0.0
        for name, color in STATE_COLORS.items():
            ax.bar(stage, mem[name] / unit, bottom=bottom, color=color, label=name if stage == 0 else None,
                   edgecolor="k" if stage == zero_stage else None, linewidth=2 if stage == zero_stage else 0)
            bottom += mem[name] / unit
        ax.text(stage, bottom, f"{bottom:.3g}", ha="center", va="bottom", fontsize=8)
    for row in measured or []:
        if row["dp"] == dp:
            states = row["weights"] + row["gradients"] + row["optimizer"]
            ax.plot(row["zero_stage"], states / unit, "kD", ms=6,
                    label="measured here (states)" if not ax.get_legend_handles_labels()[1].count(
                        "measured here (states)") else None)
    ax.set_xticks(range(4), [f"ZeRO-{s}" for s in range(4)])
    ax.set_ylabel(f"{label} per device")
    ax.set_title(f"{model.name}, dp={dp}, {precision}, recompute={recompute}")
    ax.legend(fontsize=8, loc="upper right")
    return ax


def memory_explorer(models=None, measured=None, measured_model=None):
    """Sliders: model size, dp, ZeRO stage, recomputation, precision -> bytes per device (simlib.sim.memory).

    ``measured_model`` (a ModelSpec) and ``measured`` rows put this run's measured points on its bars.
    """
    import ipywidgets as W
    import matplotlib.pyplot as plt

    from . import sim

    models = dict(models or {label: sim.gpt_size(label) for label in sim.GPT_SIZES})
    if measured_model is not None:
        models = {f"{measured_model.name} (measured here)": measured_model, **models}
    controls = dict(
        size=W.Dropdown(options=list(models), description="model"),
        dp=W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=4 if measured else 8,
                             description="dp"),
        zero_stage=W.Dropdown(options=[0, 1, 2, 3], value=3, description="ZeRO stage"),
        recompute=W.Dropdown(options=["none", "selective", "full"], value="none", description="recompute"),
        precision=W.Dropdown(options=["bf16", "fp32"], value="bf16", description="precision"),
    )

    def redraw(size, dp, zero_stage, recompute, precision):
        model = models[size]
        is_measured = measured_model is not None and model is measured_model
        draw_memory(model, dp, zero_stage, recompute, precision if not is_measured else "fp32",
                    measured=measured if is_measured else None)
        plt.tight_layout()
        plt.show()

    out = W.interactive_output(redraw, controls)
    return W.VBox([W.HBox(list(controls.values())[:3]), W.HBox(list(controls.values())[3:]), out])
