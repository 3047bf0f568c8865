"""Every explorer's redraw (simlib.widgets._common.Redraw): the old figure goes at once, an impossible choice says
why with nothing drawn, a slow redraw shows how long it has run; lesson 13's explorer says when no plan fits."""

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("ipywidgets")

from simlib.widgets._common import Redraw, _wire  # noqa: E402


def _figure(title):
    fig, ax = plt.subplots()
    ax.set_title(title)
    return fig


def test_a_failed_redraw_clears_the_old_figure_and_says_why():
    def draw(n):
        if n > 1:
            raise ValueError("no plan of 70B fits 16 GB per device on 8 devices: the smallest needs 817.0 GB")
        return _figure(f"n={n}"), f"caption {n}"

    import ipywidgets as W

    box = _wire(dict(n=W.IntSlider(value=1, min=1, max=3)), draw)
    redraw = box.redraw
    assert redraw.out.outputs, "the first draw shows its figure"
    assert redraw.status.value == "caption 1"
    box.children[0].children[0].value = 2  # the slider: no plan fits now
    assert redraw.out.outputs == (), "a figure drawn for other settings is still shown"
    assert "nothing to draw" in redraw.status.value and "817.0 GB" in redraw.status.value
    box.children[0].children[0].value = 1
    assert redraw.out.outputs and redraw.status.value == "caption 1"


def test_a_slow_redraw_shows_its_progress_and_its_time():
    seen = []

    def draw():
        time.sleep(0.7)
        return _figure("slow"), "done"

    redraw = Redraw(draw, slow_after=0.2)
    redraw.status.observe(lambda change: seen.append(change["new"]), names="value")
    redraw()
    assert any("computing…" in v and "so far" in v for v in seen), seen
    assert redraw.status.value.startswith("done") and "drawn in" in redraw.status.value
    quick = Redraw(lambda: (_figure("quick"), "quick"), slow_after=5)
    quick()
    assert quick.status.value == "quick"  # no timing said under the threshold


def test_planner_explorer_caption_says_when_nothing_fits_and_flags_an_implausible_mfu():
    from simlib import widgets
    from simlib.widgets.planner import cached_search

    space = dict(max_micro_batch=2, max_virtual_stages=1)
    with pytest.raises(ValueError, match="fits"):
        widgets.planner_figure(result=cached_search("70B", "h100", 1, 64, 2048, 16, space=space))
    fig, caption = widgets.planner_figure(result=cached_search("8B", "h100", 8, 256, 8192, 72, space=space))
    plt.close(fig)
    assert "80 % interval" in caption and "tie with it" in caption
    assert "implausible" in caption  # a dense 8B on 64 H100 above the best MFU published for the part
    t0 = time.perf_counter()
    cached_search("8B", "h100", 8, 256, 8192, 72, space=space)  # a setting seen before: no search
    assert time.perf_counter() - t0 < 0.1
