"""The explorer of lesson 07: bytes per device for ZeRO stages 0-3, recomputation and precision."""

from __future__ import annotations

STATE_COLORS = {"weights": "tab:blue", "gradients": "tab:orange", "optimizer": "tab:purple", "activations": "tab:olive"}


def draw_memory(
    model,
    dp: int,
    zero_stage: int,
    recompute: str = "none",
    precision: str = "bf16",
    micro_batch: int = 1,
    measured=None,
    ax=None,
):
    """Stacked bar of bytes per device for ZeRO stages 0-3 (the chosen one outlined), from ``simlib.sim.memory``.

    ``measured``: rows {"zero_stage", "dp", "weights", "gradients", "optimizer"} (bytes) from this run, drawn as
    black markers on the bars they belong to (same stage, same dp).
    """
    import matplotlib.pyplot as plt

    from ..sim import Strategy, memory_per_device

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    unit, label = (1e9, "GB") if model.params > 1e8 else (1e6, "MB")
    marks = {
        row["zero_stage"]: (row["weights"] + row["gradients"] + row["optimizer"]) / unit
        for row in measured or []
        if row["dp"] == dp
    }
    for stage in range(4):
        mem = memory_per_device(
            model,
            Strategy(
                dp=dp, zero_stage=stage, recompute=recompute, dtype=precision, micro_batch=micro_batch, optimizer="adam"
            ),
        )
        bottom = 0.0
        for name, color in STATE_COLORS.items():
            ax.bar(
                stage,
                mem[name] / unit,
                bottom=bottom,
                color=color,
                label=name if stage == 0 else None,
                edgecolor="k" if stage == zero_stage else None,
                linewidth=2 if stage == zero_stage else 0,
            )
            bottom += mem[name] / unit
        # the value above the bar and above a measured marker on it, so neither hides the other
        ax.annotate(
            f"{bottom:.3g}",
            (stage, max(bottom, marks.get(stage, 0.0))),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.margins(y=0.15)
    for row in measured or []:
        if row["dp"] == dp:
            states = row["weights"] + row["gradients"] + row["optimizer"]
            ax.plot(
                row["zero_stage"],
                states / unit,
                "kD",
                ms=6,
                label="measured here (states)"
                if not ax.get_legend_handles_labels()[1].count("measured here (states)")
                else None,
            )
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

    from .. import sim

    models = dict(models or {label: sim.gpt_size(label) for label in sim.GPT_SIZES})
    if measured_model is not None:
        models = {f"{measured_model.name} (measured here)": measured_model, **models}
    controls = dict(
        size=W.Dropdown(options=list(models), description="model"),
        dp=W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=4 if measured else 8, description="dp"),
        zero_stage=W.Dropdown(options=[0, 1, 2, 3], value=3, description="ZeRO stage"),
        recompute=W.Dropdown(options=["none", "selective", "full"], value="none", description="recompute"),
        precision=W.Dropdown(
            options=["bf16", "fp32"], value="fp32" if measured_model is not None else "bf16", description="precision"
        ),
    )

    def redraw(size, dp, zero_stage, recompute, precision):
        model = models[size]
        is_measured = measured_model is not None and model is measured_model
        # the measured points are fp32 AdamW states: drawn only on the fp32 bars they can be compared with
        ax = draw_memory(
            model,
            dp,
            zero_stage,
            recompute,
            precision,
            measured=measured if is_measured and precision == "fp32" else None,
        )
        if is_measured and precision != "fp32":
            ax.set_title(ax.get_title() + "\n(this run measured fp32: choose fp32 to see its points)", fontsize=9)
        plt.tight_layout()
        plt.show()

    out = W.interactive_output(redraw, controls)
    return W.VBox([W.HBox(list(controls.values())[:3]), W.HBox(list(controls.values())[3:]), out])
