"""ipywidgets explorers for the lessons: one function per explorer, each figure drawn by a pure function.

``simulator_explorer()`` (lesson 06): sliders for the parallel degrees, micro-batches, model size and hardware
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
"""
from __future__ import annotations

import numpy as np


# ── shared helpers for the lesson explorers ──────────────────────────────────────────────────────────────
def _figure(ncols=2, figsize=(11, 3.6)):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    return fig, axes


def _wire(controls: dict, draw, columns: int = 3, width: str = "330px"):
    """Controls in a grid above an output that ``draw(**values)`` fills; ``draw`` returns (figure, caption)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    text = W.HTML()

    def redraw(**values):
        try:
            fig, caption = draw(**values)
        except ValueError as exc:  # an impossible combination: say why, draw nothing
            text.value = f"<b>not a valid choice:</b> {exc}"
            return
        text.value = caption
        display(fig)
        plt.close(fig)

    out = W.interactive_output(redraw, controls)
    grid = W.GridBox(list(controls.values()), layout=W.Layout(grid_template_columns=f"repeat({columns}, {width})"))
    return W.VBox([grid, text, out])


def _log_slider(description, value, lo, hi, readout="{:.3g}"):
    import ipywidgets as W
    options = sorted({float(v) for v in np.geomspace(lo, hi, 25)} | {float(value)})
    return W.SelectionSlider(options=[(readout.format(v), v) for v in options], value=float(value),
                             description=description, continuous_update=False)


def _mb(nbytes):
    return nbytes / 2 ** 20


# ── lesson 01: the ring, step by step; the α–β model ─────────────────────────────────────────────────────
def ring_trace(world_size: int) -> list[dict]:
    """Every state of a ring all-reduce on ``world_size`` ranks, from the chunk indices the real ring uses.

    State ``i``: ``phase`` ("start", "reduce_scatter", "all_gather"), ``step``, ``holds[r][c]`` (the ranks whose
    chunk ``c`` rank ``r``'s copy of chunk ``c`` now sums), ``sends`` [(src, dst, chunk)] of the step that led
    here, and ``sent`` (chunks each rank has sent so far). Raises ValueError for world_size < 2.
    """
    from .collectives import ring_chunks, ring_neighbors

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
                new[right][chunk] = holds[right][chunk] | holds[r][chunk] if phase == "reduce_scatter" \
                    else holds[r][chunk]
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
                ax.add_patch(plt.Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, fill=False, ec="tab:orange", lw=1.5,
                                           ls="--"))
    ax.set_xticks(range(n), [f"chunk {c}" for c in range(n)])
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    phase = {"start": "before the first step", "reduce_scatter": f"reduce-scatter, step {st['step'] + 1} of {n - 1}",
             "all_gather": f"all-gather, step {st['step'] + 1} of {n - 1}"}[st["phase"]]
    ax.set_title(f"ring all-reduce on {n} ranks: {phase}")
    fig.tight_layout()
    moves = ", ".join(f"{s}→{d}: chunk {c}" for s, d, c in st["sends"])
    caption = (f"{phase}. " + (f"Dashed orange: sent, red: received ({moves}). " if moves else "")
               + f"Each rank has sent {st['sent']} chunk(s) = {st['sent']}/{n} of the tensor "
               f"(all-reduce total: {2 * (n - 1)}/{n}). 'x0+x1' = the sum of rank 0's and rank 1's values.")
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
    from .collectives import alpha_beta_time, bus_factor

    if size_bytes <= 0 or alpha < 0 or bandwidth <= 0 or world_size < 2:
        raise ValueError("size and bandwidth must be > 0, alpha >= 0, ranks >= 2")
    n, beta = world_size, 1.0 / bandwidth
    sizes = np.geomspace(2 ** 10, 2 ** 30, 121)
    times = alpha_beta_time(sizes, n, alpha, beta)
    busbw = sizes / times * bus_factor("all_reduce", n)
    fig, (ax_t, ax_b) = _figure()
    ax_t.loglog(sizes, times * 1e3, "k-", label=f"α–β model, {n} ranks")
    ax_b.semilogx(sizes, busbw / 1e9, "k-", label="α–β model")
    for op, marker in (("all_reduce", "o"), ("ring_all_reduce", "s")):
        rows = [r for r in (measured or []) if r["op"] == op and r["world_size"] == n]
        if rows:
            ax_t.loglog([r["bytes"] for r in rows], [r["time"] * 1e3 for r in rows], marker, alpha=0.7,
                        label=f"measured {op}")
            ax_b.semilogx([r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], marker, alpha=0.7,
                          label=f"measured {op}")
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
    caption = (f"{size_bytes / 2**20:.3g} MB on {n} ranks: {t * 1e3:.3g} ms = latency {latency * 1e3:.3g} ms "
               f"({latency / t:.0%}) + bytes {(t - latency) * 1e3:.3g} ms; bus bandwidth {bw / 1e9:.3g} GB/s "
               f"of the link's {bandwidth / 1e9:.3g}.")
    return fig, caption


def alpha_beta_explorer(measured=None, fits=None):
    """Message size, ranks, α and bandwidth -> time and bus bandwidth; ``fits`` {n: fit_alpha_beta(...)} seeds
    α and bandwidth with what the lesson measured, ``measured`` (sweep rows) marks the measured points."""
    import ipywidgets as W

    fit = (fits or {}).get(2) or next(iter((fits or {}).values()), None) or dict(alpha=1e-3, bandwidth=0.7e9)
    controls = dict(
        size_bytes=_log_slider("size (B)", 2 ** 20, 2 ** 10, 2 ** 30, "{:.3g}"),
        world_size=W.IntSlider(value=2, min=2, max=64, description="ranks"),
        alpha=_log_slider("α (s)", max(fit["alpha"], 1e-7), 1e-7, 1e-2),
        bandwidth=_log_slider("1/β (B/s)", fit["bandwidth"], 1e8, 1e12))
    return _wire(controls, lambda **v: alpha_beta_figure(measured=measured, **v), columns=2, width="400px")


# ── lesson 02: bucket size -> messages and overlap ───────────────────────────────────────────────────────
def _preset_dropdown():
    """Every hardware preset of ``simlib.sim.hardware.PRESETS`` (a new preset shows up here by itself)."""
    import ipywidgets as W

    from .sim.hardware import PRESETS
    return W.Dropdown(options=[(make().name, key) for key, make in PRESETS.items()], description="hardware")


def _hardware(name_or_hw):
    from . import sim
    return sim.preset(name_or_hw) if isinstance(name_or_hw, str) else name_or_hw


def bucket_figure(bucket_cap_mb: float, width: int = 1024, depth: int = 4, global_batch: int = 1024,
                  world_size: int = 2, hardware="cpu", measured=None):
    """Bucket cap -> gradient buckets (``parallel.data.make_buckets`` on the lesson's MLP) and the simulator's
    replay of one overlapped data-parallel step; beside it messages and step time over every cap.

    ``hardware``: a preset name ("cpu", "a100", "h100") or a :class:`simlib.sim.Hardware` (e.g. calibrated);
    ``measured``: rows with ``bucket_cap_mb`` and ``step_ms`` (the lesson's sweep) to mark. Returns (figure, caption).
    """
    from . import plots, sim
    from .models import MLP
    from .sim.cost import gradient_buckets

    if global_batch % world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {world_size} ranks")
    hw = _hardware(hardware)
    model = sim.from_module(MLP(width, depth), name=f"MLP {depth}x{width}")

    def strategy(cap_mb):
        return sim.Strategy(dp=world_size, micro_batch=global_batch // world_size, bucket_bytes=cap_mb * 2 ** 20,
                            overlap=True, dtype="fp32", optimizer="sgd")

    def step(cap_mb):
        table = sim.replay_data_parallel(model, hw, strategy(cap_mb), steps=2, warmup=1)
        one = table[(table.step == 1) & (table["rank"] == 0)]   # every rank alike: rank 0's spans
        busy = one[one.kind.isin(["forward", "backward", "optimizer"])].duration.sum()
        step_time = one[one.kind == "step"].duration.iloc[0]
        return table, step_time, step_time - busy

    grad_mb = _mb(model.params * 4)
    caps = np.geomspace(max(grad_mb / 2000, 1e-3), max(2 * grad_mb, 30.0), 30)
    curve = [(c, len(gradient_buckets(model, strategy(c))), *step(c)[1:]) for c in caps]
    table, step_time, exposed = step(bucket_cap_mb)
    messages = len(gradient_buckets(model, strategy(bucket_cap_mb)))
    fig, (ax_g, ax_c) = _figure(figsize=(13, 3.8))
    plots.gantt(table[table["rank"] == 0], ax=ax_g, step=1,
                title=f"predicted step, rank 0 ({messages} bucket(s) of ≤ {bucket_cap_mb:.3g} MB)")
    ax_c.semilogx([c[0] for c in curve], [c[2] * 1e3 for c in curve], "k-", label="predicted step time")
    ax_c.semilogx([c[0] for c in curve], [c[3] * 1e3 for c in curve], "r--", label="predicted exposed comm")
    if measured is not None:
        rows = [r for r in (measured.to_dict("records") if hasattr(measured, "to_dict") else measured)
                if r.get("mode", "bucket") == "bucket"]
        ax_c.plot([r["bucket_cap_mb"] for r in rows], [r["step_ms"] for r in rows], "o", color="tab:blue",
                  label="measured step (this lesson)")
    ax_c.axvline(bucket_cap_mb, color="tab:orange", label="your cap")
    ax_c.axvline(grad_mb, color="gray", ls=":", label=f"all gradients {grad_mb:.1f} MB")
    ax_m = ax_c.twinx()
    ax_m.semilogx([c[0] for c in curve], [c[1] for c in curve], color="tab:green", drawstyle="steps-post")
    ax_m.set_ylabel("all-reduces per step", color="tab:green")
    ax_c.set(xlabel="bucket cap (MB)", ylabel="ms", title=f"{world_size} ranks on {hw.name}")
    ax_c.legend(fontsize=7, loc="upper center")
    ax_c.grid(alpha=0.3)
    fig.tight_layout()
    caption = (f"{model.name}, {grad_mb:.1f} MB of fp32 gradients, {world_size} ranks on {hw.name}: {messages} "
               f"all-reduce(s) per step; predicted step {step_time * 1e3:.3g} ms of which {exposed * 1e3:.3g} ms "
               f"is communication not hidden behind backward.")
    return fig, caption


def bucket_explorer(measured=None, width: int = 1024, depth: int = 4, global_batch: int = 1024):
    """Bucket cap, ranks and hardware -> buckets, overlap and step time; ``measured`` (the lesson's bucket
    sweep, on this machine) is marked when the hardware is the CPU box."""
    import ipywidgets as W

    controls = dict(bucket_cap_mb=_log_slider("cap (MB)", 4.0, 0.01, 100.0),
                    world_size=W.SelectionSlider(options=[2, 4, 8], value=2, description="ranks"),
                    hardware=_preset_dropdown())

    def draw(bucket_cap_mb, world_size, hardware):
        return bucket_figure(bucket_cap_mb, width, depth, global_batch, world_size, hardware,
                             measured=measured if hardware == "cpu" and world_size == 2 else None)
    return _wire(controls, draw)


# ── lesson 03: micro-batches -> memory and messages ──────────────────────────────────────────────────────
def accumulation_figure(global_batch: int, accumulation_steps: int, world_size: int = 2, no_sync: bool = True,
                        width: int = 1024, depth: int = 4, measured_memory=None, measured_all_reduces=None):
    """Accumulation steps k -> micro-batch size, peak memory and all-reduces per optimizer step.

    Memory: weights + gradients of the lesson's MLP, plus activations growing with the micro-batch: the slope
    fitted to ``measured_memory`` (rows ``micro_batch``, ``peak_mb`` from ``accumulate.peak_memory``) when given,
    else (depth + 1)·width floats per sample. Messages: DDP's buckets (``parallel.data.make_buckets``, 25 MB)
    once per step with ``no_sync``, once per micro-batch without. ``measured_all_reduces``:
    {(k, no_sync): all-reduces per step} measured by the lesson. Returns (figure, caption).
    """
    from .models import MLP
    from .parallel.data import make_buckets

    per_rank, rest = divmod(global_batch, world_size * accumulation_steps)
    if rest or per_rank < 1:
        raise ValueError(f"a global batch of {global_batch} does not split into {accumulation_steps} micro-batches "
                         f"on each of {world_size} ranks")
    model = MLP(width, depth)
    params = sum(p.numel() for p in model.parameters())
    fixed_mb = _mb(2 * 4 * params)                           # fp32 weights + gradients
    buckets = len(make_buckets(model.parameters(), 25.0))
    if measured_memory is not None and len(measured_memory) >= 2:
        rows = measured_memory.to_dict("records") if hasattr(measured_memory, "to_dict") else measured_memory
        slope, intercept = np.polyfit([r["micro_batch"] for r in rows], [r["peak_mb"] for r in rows], 1)
        source = "fitted to the measured points"
    else:
        rows, slope, intercept = [], _mb((depth + 1) * width * 4), 0.0
        source = "(depth + 1)·width floats per sample"
    fig, (ax_m, ax_c) = _figure()
    batches = np.geomspace(1, max(global_batch // world_size, 2), 60)
    ax_m.semilogx(batches, fixed_mb + intercept + slope * batches, "k-", label=f"model: activations {source}")
    ax_m.axhline(fixed_mb, color="gray", ls="--", label=f"weights + gradients {fixed_mb:.1f} MB")
    if rows:
        ax_m.plot([r["micro_batch"] for r in rows], [fixed_mb + r["peak_mb"] for r in rows], "o", color="tab:blue",
                  label="measured (+ weights, gradients)")
    mem = fixed_mb + intercept + slope * per_rank
    ax_m.plot([per_rank], [mem], "r*", ms=14, label=f"micro-batch {per_rank}")
    ax_m.set(xlabel="micro-batch size per rank", ylabel="MB per rank", title="peak memory follows the micro-batch")
    ks = [k for k in (1, 2, 4, 8, 16, 32) if global_batch % (world_size * k) == 0]
    for flag, style in ((False, "s--"), (True, "o-")):
        ax_c.plot(ks, [buckets * (1 if flag else k) for k in ks], style, label=f"no_sync={flag}")
    for (k, flag), count in (measured_all_reduces or {}).items():
        ax_c.plot([k], [count], "x", color="k", ms=10, mew=2, label=f"measured (k={k}, no_sync={flag})")
    ax_c.plot([accumulation_steps], [buckets * (1 if no_sync else accumulation_steps)], "r*", ms=14, label="yours")
    ax_c.set(xlabel="accumulation steps k", ylabel="all-reduces per optimizer step", xscale="log",
             title=f"messages: {_mb(4 * params):.1f} MB of gradients each")
    ax_c.set_xscale("log", base=2)
    for ax in (ax_m, ax_c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    sends = buckets * (1 if no_sync else accumulation_steps)
    caption = (f"global batch {global_batch} = {world_size} ranks × {accumulation_steps} micro-batches × {per_rank}: "
               f"~{mem:.1f} MB per rank at the peak; {sends} all-reduce(s) per optimizer step "
               f"({sends * _mb(4 * params) / buckets:.1f} MB sent into them).")
    return fig, caption


def accumulation_explorer(measured_memory=None, measured_all_reduces=None, width: int = 1024, depth: int = 4):
    import ipywidgets as W

    controls = dict(global_batch=W.SelectionSlider(options=[2 ** i for i in range(4, 13)], value=1024,
                                                   description="global batch"),
                    accumulation_steps=W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=4, description="k"),
                    world_size=W.SelectionSlider(options=[1, 2, 4, 8], value=2, description="ranks"),
                    no_sync=W.Checkbox(value=True, description="no_sync"))
    return _wire(controls, lambda **v: accumulation_figure(width=width, depth=depth, measured_memory=measured_memory,
                                                           measured_all_reduces=measured_all_reduces, **v),
                 columns=2, width="400px")


# ── lesson 04: a schedule -> Gantt chart and bubble ──────────────────────────────────────────────────────
def pipeline_figure(schedule: str = "1f1b", num_stages: int = 4, num_microbatches: int = 8, num_chunks: int = 2,
                    backward_ratio: float = 2.0, p2p_ratio: float = 0.0, measured=None):
    """Build ``schedule`` with ``parallel.schedules``, check it, replay it (``sim.replay_pipeline``: a forward of
    the whole stage takes 1, a backward ``backward_ratio``, a message ``p2p_ratio``) -> Gantt chart; beside it the
    bubble (``pipeline_experiments.bubble`` on the replay) against m, the formula, and ``measured`` (rows
    ``microbatches``, ``bubble``, ``bubble_iqr``, measured at ``measured_stages`` = 2) when p = 2.
    Returns (figure, caption)."""
    import matplotlib.pyplot as plt

    from . import plots
    from .parallel import schedules
    from .parallel.pipeline_experiments import bubble, make_schedule
    from .sim import replay_pipeline

    v = num_chunks if schedule == "interleaved_1f1b" else 1

    def replay(m):
        s = make_schedule(schedule, num_stages, m, v)
        schedules.check(s)
        unit = 1e-3  # plots.gantt draws milliseconds: one forward of a whole stage reads as 1
        return s, replay_pipeline(s, unit / v, unit * backward_ratio / v, unit * p2p_ratio, steps=1)

    sched, table = replay(num_microbatches)
    b = bubble(table)["bubble"]
    formula = schedules.bubble_fraction(num_stages, num_microbatches, v)
    fig = plt.figure(figsize=(13, 0.9 + 0.5 * num_stages + 1.5))
    ax_g = fig.add_axes([0.05, 0.18, 0.55, 0.7])
    ax_b = fig.add_axes([0.76, 0.18, 0.22, 0.7])
    labelled = table.assign(name=table.name.where(table.kind.isin(["forward", "backward"]), ""))
    plots.gantt(labelled, ax=ax_g, step=0, label_spans=num_stages * num_microbatches * v <= 32,
                title=f"{schedule}, p = {num_stages}, m = {num_microbatches}" + (f", v = {v}" if v > 1 else ""))
    ax_g.set_xlabel("time (forward of one stage = 1 unit)")
    ms = [m for m in range(1, 17) if schedule != "interleaved_1f1b" or m % num_stages == 0]
    ax_b.plot(ms, [bubble(replay(m)[1])["bubble"] for m in ms], "k.-", label="replayed")
    ax_b.plot(ms, [schedules.bubble_fraction(num_stages, m, v) for m in ms], "g--", label="(p−1)/(v·m+p−1)")
    if measured is not None and num_stages == 2 and v == 1:
        rows = measured.to_dict("records") if hasattr(measured, "to_dict") else measured
        ax_b.errorbar([r["microbatches"] for r in rows], [r["bubble"] for r in rows],
                      yerr=[r.get("bubble_iqr", 0) / 2 for r in rows], fmt="o", color="tab:red",
                      label="measured, p = 2")
    ax_b.plot([num_microbatches], [b], "r*", ms=14)
    ax_b.set(xlabel="micro-batches m", ylabel="bubble (idle share)", ylim=(0, 1), title="bubble")
    ax_b.legend(fontsize=7)
    ax_b.grid(alpha=0.3)
    peaks = schedules.peak_activations(sched)
    caption = (f"{schedule}: bubble {b:.2f} of the step (formula {formula:.2f}"
               + (", which leaves out the messages" if p2p_ratio else "") + f"); micro-batches in flight per rank "
               f"{peaks}; {sum(a.op == 'send_forward' for r in sched for a in r)} activations sent per step.")
    return fig, caption


def pipeline_explorer(measured=None):
    """Schedule, stages, micro-batches, chunks, backward/forward and message cost -> Gantt chart and bubble;
    ``measured`` (the lesson's bubble sweep at p = 2) is marked when p = 2."""
    import ipywidgets as W

    controls = dict(schedule=W.Dropdown(options=["gpipe", "1f1b", "interleaved_1f1b"], value="1f1b",
                                        description="schedule"),
                    num_stages=W.IntSlider(value=2, min=2, max=8, description="stages p"),
                    num_microbatches=W.IntSlider(value=4, min=1, max=16, description="micro-batches"),
                    num_chunks=W.IntSlider(value=2, min=2, max=4, description="chunks v"),
                    backward_ratio=W.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.5, description="B / F"),
                    p2p_ratio=W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05, description="message / F"))
    return _wire(controls, lambda **v: pipeline_figure(measured=measured, **v))


# ── lesson 05: tensor-parallel communication volume ──────────────────────────────────────────────────────
def tp_figure(batch: int, seq: int, hidden: int, tp_size: int, hardware="cpu", dtype: str = "fp32",
              measured=None):
    """All-reduce bytes of one Megatron MLP block per step (``parallel.tensor.comm_volume``) and their time
    (``sim.cost.all_reduce``) against the block's GEMM time (``sim.cost.gemm_time``), for t = 1, 2, 4, 8.

    ``measured``: rows with ``seq``, ``batch``, ``hidden``, ``measured_MB`` (the lesson's CommLog) to mark.
    Returns (figure, caption).
    """
    from .parallel.tensor import comm_volume
    from .sim.cost import all_reduce, gemm_time

    hw = _hardware(hardware)
    if hidden % tp_size or min(batch, seq, hidden) < 1:
        raise ValueError(f"hidden ({hidden}) must split evenly over tp = {tp_size}")
    nbytes = 4 if dtype == "fp32" else 2

    def costs(t, s=seq):
        vol = comm_volume(batch, s, hidden, t, nbytes)
        tokens, ffn = batch * s, 4 * hidden // t
        processes = min(t, hw.devices_per_node)
        forward = gemm_time(tokens, hidden, ffn, hw, dtype, processes) + gemm_time(tokens, ffn, hidden, hw, dtype,
                                                                                   processes)
        comm = 2 * all_reduce(vol["payload_bytes"], t, hw) if t > 1 else 0.0
        return vol, 3 * forward, comm          # backward ≈ 2 × forward GEMMs

    fig, (ax_v, ax_t) = _figure()
    seqs = np.unique(np.geomspace(16, max(4096, seq), 40).astype(int))
    ax_v.loglog(seqs, [costs(tp_size, s)[0]["step_payload_bytes"] / 1e6 for s in seqs], "k-",
                label=f"formula 2·B·S·H·{nbytes} B (B={batch}, H={hidden})")
    ax_v.loglog(seqs, [costs(tp_size, s)[0]["per_rank_bytes"] / 1e6 for s in seqs], "k:",
                label=f"sent per rank, ring, t={tp_size}")
    rows = measured.to_dict("records") if hasattr(measured, "to_dict") else (measured or [])
    if rows:
        ax_v.plot([r["seq"] for r in rows], [r["measured_MB"] for r in rows], "o", color="tab:red",
                  label="measured (CommLog), " + ", ".join(sorted({f"B={r['batch']} H={r['hidden']}" for r in rows})))
    vol, compute, comm = costs(tp_size)
    ax_v.plot([seq], [vol["step_payload_bytes"] / 1e6], "r*", ms=14)
    ax_v.set(xlabel="sequence length S", ylabel="MB per block per step", title="all-reduce volume")
    degrees = [1, 2, 4, 8]
    parts = [costs(t) for t in degrees]
    ax_t.bar([str(t) for t in degrees], [p[1] * 1e3 for p in parts], color="tab:blue", label="GEMMs (fwd + bwd)")
    ax_t.bar([str(t) for t in degrees], [p[2] * 1e3 for p in parts], bottom=[p[1] * 1e3 for p in parts],
             color="tab:red", label="2 all-reduces (on the critical path)")
    for i, (_, c, a) in enumerate(parts):
        ax_t.text(i, (c + a) * 1e3, f"{a / (c + a):.0%}", ha="center", va="bottom", fontsize=8)
    ax_t.set(xlabel="tensor-parallel degree t", ylabel="ms per block per step", title=f"predicted on {hw.name}")
    for ax in (ax_v, ax_t):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    caption = (f"B={batch}, S={seq}, H={hidden}, t={tp_size}, {dtype}: {vol['step_payload_bytes'] / 1e6:.3g} MB "
               f"all-reduced per block per step (each rank sends {vol['per_rank_bytes'] / 1e6:.3g} MB); on "
               f"{hw.name} that takes {comm * 1e3:.3g} ms against {compute * 1e3:.3g} ms of GEMMs "
               f"({comm / (comm + compute):.0%} of the block's time).")
    return fig, caption


def tp_explorer(measured=None, batch: int = 8, seq: int = 128, hidden: int = 1024):
    """Batch, sequence, hidden size, t, dtype and hardware -> all-reduce volume and its share of a block's time;
    ``measured`` (the lesson's volume table) is marked; ``batch``, ``seq``, ``hidden`` set where the sliders start."""
    import ipywidgets as W

    def options(values, value):
        return sorted(set(values) | {value})

    controls = dict(batch=W.SelectionSlider(options=options([1, 2, 4, 8, 16, 32], batch), value=batch,
                                            description="batch B"),
                    seq=W.SelectionSlider(options=options([2 ** i for i in range(5, 13)], seq), value=seq,
                                          description="seq S"),
                    hidden=W.SelectionSlider(options=options([256, 512, 1024, 2048, 4096, 8192], hidden),
                                             value=hidden, description="hidden H"),
                    tp_size=W.SelectionSlider(options=[2, 4, 8], value=2, description="t"),
                    hardware=_preset_dropdown(),
                    dtype=W.Dropdown(options=["fp32", "bf16"], description="dtype"))
    return _wire(controls, lambda **v: tp_figure(measured=measured, **v))


# ── lesson 06: the simulator ─────────────────────────────────────────────────────────────────────────────
def explain(model, hardware, strategy) -> str:
    """One prediction as a few lines of text (also what the explorer prints)."""
    from .sim import predict

    try:
        p = predict(model, hardware, strategy)
    except ValueError as exc:
        return f"not a valid configuration: {exc}"
    mem = p.memory["total"] / 1e9
    where = f"{model.name} on {strategy.world_size} x {hardware.name}"
    if not p.fits:  # it would not run: no step time or throughput to report
        return (f"{where}: does NOT fit — {mem:.1f} GB per device of {hardware.memory_bytes / 1e9:.0f} GB "
                f"(90 % usable); no throughput. Try ZeRO, more tp/pp, recomputation or a smaller micro-batch.")
    return (f"{where}: step {p.step_time:.3g} s "
            f"(compute {p.compute:.3g}, exposed comm {p.exposed_comm:.3g}, bubble {p.bubble:.3g}), "
            f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.0%}; memory {mem:.1f} GB per device: fits")


def explorer_view(model, hardware, strategy):
    """What the explorer shows for one configuration: (text, prediction or None).

    None means draw nothing: the plan is impossible (tensor parallelism across nodes, layers that do not split,
    ...), and the text says why. A plan that does not fit still returns its prediction (the memory chart shows
    why) but its text reports no throughput."""
    from .sim import predict

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

    from .sim import predict

    p = predict(model, hardware, strategy)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    ax_t, ax_m = axes
    if p.fits:
        parts = {"compute": p.compute, "exposed comm": p.exposed_comm, "bubble": p.bubble,
                 "optimizer": p.optimizer}
        left = 0.0
        for (name, value), color in zip(parts.items(), ["tab:blue", "tab:red", "tab:gray", "tab:green"]):
            ax_t.barh([0], [value], left=left, color=color, label=name)
            left += value
        ax_t.set_xlabel("seconds per step")
        ax_t.set_title(f"step {p.step_time:.3g} s, MFU {p.mfu:.0%}")
        ax_t.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8)
    else:
        ax_t.text(0.5, 0.5, "does not fit in memory:\nno step time, no throughput", ha="center", va="center",
                  transform=ax_t.transAxes)
        ax_t.set_xticks([])
    ax_t.set_yticks([])
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
    """Sliders -> live prediction. Returns the widget box (display it, or leave it last in a cell).

    Every change clears the plot first: an impossible plan (tensor parallelism across nodes, layers that do not
    split into the stages) shows only the reason, never the previous configuration's chart."""
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
            strategy = sim.Strategy(dp=v["dp"], tp=v["tp"], pp=v["pp"], micro_batch=v["micro_batch"],
                                    num_micro_batches=v["num_micro_batches"], zero_stage=v["zero"],
                                    recompute=v["recompute"], overlap=True)
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


def checkpoint_interval_explorer(save_seconds: float = 30.0, mtbf_hours: float = 24.0, restart_seconds: float = 60.0):
    """Sliders for the save time, the job's mean time between failures and the restart time; prints Young's and
    Daly's checkpoint interval and the share of time lost (``simlib.checkpoint``)."""
    import math

    from ipywidgets import FloatLogSlider, interact

    from .checkpoint import checkpoint_interval, wasted_fraction

    def show(save_seconds, mtbf_hours, restart_seconds):
        m = mtbf_hours * 3600
        young, daly = math.sqrt(2 * save_seconds * m), checkpoint_interval(save_seconds, m)
        print(f"Young: every {young / 3600:.2f} h ({young / 60:.1f} min); Daly: every {daly / 3600:.2f} h "
              f"({daly / 60:.1f} min) of compute")
        print(f"time lost at Daly's interval: {wasted_fraction(daly, save_seconds, m, restart_seconds):.1%}; "
              f"checkpointing 4x as often: {wasted_fraction(daly / 4, save_seconds, m, restart_seconds):.1%}, "
              f"4x as rarely: {wasted_fraction(daly * 4, save_seconds, m, restart_seconds):.1%}")

    # fine steps (0.1 % apart): the sliders start at the values given, not at the nearest of a coarse grid
    return interact(show, save_seconds=FloatLogSlider(value=save_seconds, base=10, min=-1, max=4, step=0.0005,
                                                      description="save (s)", readout_format=".4g"),
                    mtbf_hours=FloatLogSlider(value=mtbf_hours, base=10, min=-1, max=3, step=0.0005,
                                              description="MTBF (h)", readout_format=".4g"),
                    restart_seconds=FloatLogSlider(value=restart_seconds, base=10, min=0, max=3.5, step=0.0005,
                                                   description="restart (s)", readout_format=".4g"))


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
    marks = {row["zero_stage"]: (row["weights"] + row["gradients"] + row["optimizer"]) / unit
             for row in measured or [] if row["dp"] == dp}
    for stage in range(4):
        mem = memory_per_device(model, Strategy(dp=dp, zero_stage=stage, recompute=recompute, dtype=precision,
                                                micro_batch=micro_batch, optimizer="adam"))
        bottom = 0.0
        for name, color in STATE_COLORS.items():
            ax.bar(stage, mem[name] / unit, bottom=bottom, color=color, label=name if stage == 0 else None,
                   edgecolor="k" if stage == zero_stage else None, linewidth=2 if stage == zero_stage else 0)
            bottom += mem[name] / unit
        # the value above the bar and above a measured marker on it, so neither hides the other
        ax.annotate(f"{bottom:.3g}", (stage, max(bottom, marks.get(stage, 0.0))), xytext=(0, 6),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.margins(y=0.15)
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
        precision=W.Dropdown(options=["bf16", "fp32"], value="fp32" if measured_model is not None else "bf16",
                             description="precision"),
    )

    def redraw(size, dp, zero_stage, recompute, precision):
        model = models[size]
        is_measured = measured_model is not None and model is measured_model
        # the measured points are fp32 AdamW states: drawn only on the fp32 bars they can be compared with
        ax = draw_memory(model, dp, zero_stage, recompute, precision,
                         measured=measured if is_measured and precision == "fp32" else None)
        if is_measured and precision != "fp32":
            ax.set_title(ax.get_title() + "\n(this run measured fp32: choose fp32 to see its points)", fontsize=9)
        plt.tight_layout()
        plt.show()

    out = W.interactive_output(redraw, controls)
    return W.VBox([W.HBox(list(controls.values())[:3]), W.HBox(list(controls.values())[3:]), out])
