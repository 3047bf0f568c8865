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


def checkpoint_interval_explorer(save_seconds: float = 30.0, mtbf_hours: float = 24.0, restart_seconds: float = 60.0):
    """Sliders for the save time, the job's mean time between failures and the restart time; prints Young's and
    Daly's checkpoint interval and the share of time lost (``simlib.checkpoint``)."""
    import math

    from ipywidgets import FloatLogSlider, interact

    from .checkpoint import checkpoint_interval, wasted_fraction

    def show(save_seconds, mtbf_hours, restart_seconds):
        m = mtbf_hours * 3600
        young, daly = math.sqrt(2 * save_seconds * m), checkpoint_interval(save_seconds, m)
        print(f"Young: every {young / 60:.1f} min; Daly: every {daly / 60:.1f} min of compute")
        print(f"time lost at Daly's interval: {wasted_fraction(daly, save_seconds, m, restart_seconds):.1%}; "
              f"checkpointing 4x as often: {wasted_fraction(daly / 4, save_seconds, m, restart_seconds):.1%}, "
              f"4x as rarely: {wasted_fraction(daly * 4, save_seconds, m, restart_seconds):.1%}")

    return interact(show, save_seconds=FloatLogSlider(value=save_seconds, base=10, min=-1, max=3, step=0.1,
                                                      description="save (s)"),
                    mtbf_hours=FloatLogSlider(value=mtbf_hours, base=10, min=-1, max=3, step=0.1,
                                              description="MTBF (h)"),
                    restart_seconds=FloatLogSlider(value=restart_seconds, base=10, min=0, max=3.5, step=0.1,
                                                   description="restart (s)"))
