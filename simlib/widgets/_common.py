"""Helpers every lesson's explorer shares: a figure, controls wired to a pure drawing function, presets."""

from __future__ import annotations

import numpy as np


def _figure(ncols=2, figsize=(11, 3.6)):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    return fig, axes


class Redraw:
    """Calls ``draw(**values)`` -> (figure, caption) and shows the result: the old figure is cleared at once (a
    caption is never shown above a figure drawn for other settings), an impossible choice (``ValueError``, e.g. no
    plan fits) says why with nothing drawn, and a redraw that takes longer than ``slow_after`` seconds shows how
    long it has run, every second, until it is done."""

    def __init__(self, draw, slow_after: float = 2.0):
        import ipywidgets as W

        self.draw, self.slow_after = draw, slow_after
        self.status = W.HTML()
        self.out = W.Output()
        self.seconds = 0.0

    def __call__(self, **values):
        import threading
        import time

        import matplotlib.pyplot as plt

        self.out.outputs = ()  # clear now, not when the next figure arrives
        self.status.value = "<i>drawing…</i>"
        start, done = time.perf_counter(), threading.Event()

        def tick():  # from a thread: the kernel is busy in draw(); widget updates still reach the page
            while not done.wait(min(1.0, self.slow_after)):
                elapsed = time.perf_counter() - start
                if elapsed >= self.slow_after:
                    self.status.value = f"<i>computing… {elapsed:.0f} s so far (the figure appears when done)</i>"

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            fig, caption = self.draw(**values)
        except ValueError as exc:  # an impossible combination: say why, draw nothing
            self.status.value = f"<b>nothing to draw:</b> {exc}"
            return
        finally:
            done.set()
            ticker.join()
            self.seconds = time.perf_counter() - start
        slow = f" <i>(drawn in {self.seconds:.1f} s)</i>" if self.seconds >= self.slow_after else ""
        self.status.value = caption + slow
        self.out.append_display_data(fig)
        plt.close(fig)


def _wire(controls: dict, draw, columns: int = 3, width: str = "330px", slow_after: float = 2.0):
    """Controls in a grid above an output that ``draw(**values)`` fills; ``draw`` returns (figure, caption).
    Every change redraws through :class:`Redraw`."""
    import ipywidgets as W

    redraw = Redraw(draw, slow_after)

    def on_change(_=None):
        redraw(**{k: c.value for k, c in controls.items()})

    for control in controls.values():
        control.observe(on_change, names="value")
    on_change()
    grid = W.GridBox(list(controls.values()), layout=W.Layout(grid_template_columns=f"repeat({columns}, {width})"))
    box = W.VBox([grid, redraw.status, redraw.out])
    box.redraw = redraw  # for tests and for a lesson that wants the last redraw's time
    return box


def _log_slider(description, value, lo, hi, readout="{:.3g}"):
    import ipywidgets as W

    options = sorted({float(v) for v in np.geomspace(lo, hi, 25)} | {float(value)})
    return W.SelectionSlider(
        options=[(readout.format(v), v) for v in options],
        value=float(value),
        description=description,
        continuous_update=False,
    )


def _mb(nbytes):
    return nbytes / 2**20


def _preset_dropdown():
    """Every hardware preset of ``simlib.sim.hardware_presets.PRESETS`` (a new preset shows up here by itself)."""
    import ipywidgets as W

    from ..sim.hardware_presets import PRESETS

    return W.Dropdown(options=[(make().name, key) for key, make in PRESETS.items()], description="hardware")


def _hardware(name_or_hw):
    from .. import sim

    return sim.preset(name_or_hw) if isinstance(name_or_hw, str) else name_or_hw
