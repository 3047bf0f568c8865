"""ipywidgets explorers for the lessons: one function per explorer, each figure drawn by a pure function.

``simulator_explorer()`` (lesson 09c): sliders for the parallel degrees, micro-batches, model size and hardware
preset; each change redraws the simulator's prediction (step-time breakdown and memory per device) live.

Lessons 01-05 (each ``*_explorer`` only wires controls to its ``*_figure``; a test calls the figures without a
browser, and every number they draw comes from the library code the lesson teaches):

- ``ring_explorer`` / ``ring_figure``: ring all-reduce step by step (``collectives.ring_chunks``, the indices the
  real ring uses); ``alpha_beta_explorer`` / ``alpha_beta_figure``: α–β time and bus bandwidth, measured points
- ``bucket_explorer`` / ``bucket_figure``: bucket cap -> messages, overlap and step time (``make_buckets`` and the
  simulator's data-parallel replay)
- ``accumulation_explorer`` / ``accumulation_figure``: micro-batches -> memory and all-reduces per step
- ``pipeline_explorer`` / ``pipeline_figure``: a schedule from ``parallel.schedules`` -> Gantt chart and bubble
- ``tp_explorer`` / ``tp_figure``: tensor-parallel all-reduce volume and time against compute

Pass what the lesson measured (``measured=...``) and the explorer marks it beside the model's curve.

One module per lesson (``collectives`` 01, ``data_parallel`` 02, ``accumulation`` 03, ``pipeline`` 04, ``tensor`` 05,
``simulator`` 06, ``memory`` 07, ``fault_tolerance`` 08, ``context_experts`` 09, ``planner`` 13); shared helpers in ``_common``. Every name is here too.
"""

from __future__ import annotations

from .accumulation import accumulation_explorer, accumulation_figure
from .collectives import alpha_beta_explorer, alpha_beta_figure, ring_explorer, ring_figure, ring_trace
from .context_experts import context_explorer, context_figure, moe_explorer, moe_figure
from .data_parallel import bucket_explorer, bucket_figure
from .fault_tolerance import checkpoint_interval_explorer
from .memory import STATE_COLORS, draw_memory, memory_explorer
from .pipeline import pipeline_explorer, pipeline_figure
from .planner import planner_explorer, planner_figure
from .simulator import draw_prediction, explain, explorer_view, simulator_explorer
from .tensor import tp_explorer, tp_figure

__all__ = [
    "ring_trace",
    "ring_figure",
    "ring_explorer",
    "alpha_beta_figure",
    "alpha_beta_explorer",
    "bucket_figure",
    "bucket_explorer",
    "accumulation_figure",
    "accumulation_explorer",
    "pipeline_figure",
    "pipeline_explorer",
    "tp_figure",
    "tp_explorer",
    "explain",
    "explorer_view",
    "draw_prediction",
    "simulator_explorer",
    "draw_memory",
    "memory_explorer",
    "STATE_COLORS",
    "checkpoint_interval_explorer",
    "context_figure",
    "context_explorer",
    "moe_figure",
    "moe_explorer",
    "planner_figure",
    "planner_explorer",
]
