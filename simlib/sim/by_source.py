"""Validation by source: fit on every other source, predict the one left out (leave-one-source-out, LOSO).

The published runs the simulator is checked against come from independent sources (``SOURCES``): llm-foundry's
MPT tables, torchtitan's Llama tables, Narayanan et al. 2021 and Korthikanti et al. 2022 (Megatron-LM, A100),
Megatron-Bridge's 25.11/26.02 tables (NVIDIA NeMo; CP, MoE, Blackwell, FP8) and Llama 3's Table 4. Within one
source the runs share a software stack, a recipe and a way of measuring, so a term fitted on half a source and
scored on its other half learns the source's offsets: that within-source split (``runs``/``scale_runs``'s "fit" and
"test" halves) is reported beside the LOSO figure as what it is, not as the headline.

**Terms fitted on data** (:data:`FITTED_TERMS`): each names the quantity, how it is fitted and which sources fit
the value the library ships. Under LOSO each is refitted on the other sources' rows only (every half), so that no
row of the left-out source reaches its own prediction. A term with no row of its kind outside the left-out source
falls back to its unfitted value (0: the physics alone), and the table says so.

What LOSO cannot remove: the cost model's structure and its constants from public sources (nccl-tests, vendors'
peak FLOP/s, kernel measurements) were chosen while looking at the fit halves of every source; LOSO refits only
what is fitted by code. The figure is therefore an optimistic bound on a truly unseen source's error.

**Intervals** (:func:`intervals`): a prediction's 80 % interval is the 10th–90th percentile of the LOSO log
residuals log(predicted / measured) of similar runs (same family — dense or MoE — and scale bucket), each source
weighted equally, taken from the *other* sources only when the interval is itself scored (so the coverage reported
is of unseen runs). Fewer than :data:`MIN_POOL` such residuals: the family's; fewer still: all of them.

**Plausibility** (:func:`best_published_mfu`): the best MFU measured by any run of the set for a part and dtype; a
prediction above it is flagged (:func:`plausibility`).
"""

from __future__ import annotations

import json
import math
import statistics
from functools import lru_cache
from pathlib import Path

SOURCES = {
    "llm-foundry": "MosaicML llm-foundry, scripts/train/benchmarking/README.md (MPT, FSDP, A100/H100)",
    "torchtitan": "PyTorch torchtitan, docs/performance.md (Llama, FSDP2, A100)",
    "Narayanan 2021": "Narayanan et al. 2021 Table 1 (Megatron-LM, tp × pp × dp, A100)",
    "Korthikanti 2022": "Korthikanti et al. 2022 Table 5 (Megatron-LM, sequence parallel, recompute, A100)",
    "megatron-bridge": "NVIDIA Megatron-Bridge 25.11/26.02 performance tables (CP, MoE, FP8, H100/Blackwell)",
    "llama3-paper": "Dubey et al. 2024 Table 4 (Llama 3 405B, 8K/16K H100)",
}
MIN_POOL = 10  # residuals an interval's cell needs before it is used (else the family's, else every one)
COVERAGE = 0.80  # the interval's nominal coverage
SCALES = ((64, "≤64 GPUs"), (1024, "65–1,024 GPUs"), (math.inf, ">1,024 GPUs"))


def _moe_ratios() -> list[tuple[str, str, float]]:
    from .scale_runs import moe_host_ratios

    return moe_host_ratios()


def _fit_moe_host(sources: set[str]) -> float | None:
    """The MoE host term fitted on the rows of ``sources`` (the median ratio); None if they hold no MoE row."""
    ratios = [r for _, src, r in _moe_ratios() if src in sources]
    # a host time is not negative: where the other sources' rows run faster than the physics without it, 0
    return max(0.0, statistics.median(ratios)) if ratios else None


# name -> (module attribute it sets, fit(sources) -> value or None, the sources that fit the shipped value)
FITTED_TERMS = {
    "MOE_HOST_PER_LOCAL_EXPERT": dict(
        module="simlib.sim.cluster_ops",
        fit=_fit_moe_host,
        shipped_from=(
            "megatron-bridge (its fit half: 15 MoE rows)",
            "megatron-moe-modelzoo (its fit half: 4 stated MoE rows)",
            "nemo-automodel (its fit half: 1 stated MoE row)",
        ),
        unfitted=0.0,
        doc="host time per local expert per MoE layer pass (Transformer Engine's per-expert launches)",
    ),
}


def scale_of(gpus: int) -> str:
    return next(name for limit, name in SCALES if gpus <= limit)


def kinds_of(row: dict) -> list[str]:
    """The kinds a row counts under (a row counts under each of its kinds)."""
    out = ["moe" if "moe" in (row.get("kinds") or "") else "dense"]
    gpu = str(row["gpu"])
    out.append("a100" if gpu.startswith("a100") else "hopper" if gpu.startswith(("h100", "h200")) else "blackwell")
    if row.get("cp", 1) > 1 or row["seq_len"] >= 32768:
        out.append("long_context")
    if str(row["precision"]).startswith("fp8") or "fp8" in (row.get("kinds") or ""):
        out.append("fp8")
    if row.get("fsdp_like"):
        out.append("fsdp")
    if row["pp"] > 1:
        out.append("pipeline")
    if row["tp"] > 1:
        out.append("tensor")
    if row["gpus"] > 1024:
        out.append("thousands")
    return out


def _rows(moe_host: float | None = None, only_moe: bool = False) -> list[dict]:
    """Every expressible row of both sets, predicted (``moe_host``: the MoE term's value for this pass)."""
    from . import cluster_ops, runs, scale_runs

    saved = cluster_ops.MOE_HOST_PER_LOCAL_EXPERT
    if moe_host is not None:
        cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = moe_host
    try:
        out = []
        if not only_moe:
            raw = {r["id"]: r for r in runs.load_rows()}
            for r in runs.validation_table().to_dict("records"):
                if r["expressible"]:
                    src = raw.get(r["id"])
                    r.update(
                        cp=src["cp"] if src else 1,
                        fsdp_like=r["sharding"] not in ("none", ""),
                        seq_len=r["seq_len"],
                        kinds="",
                    )
                    out.append(r)
        for raw_row in scale_runs.load_rows():
            if scale_runs.why_inexpressible(raw_row):
                continue
            if only_moe and "moe" not in scale_runs.kinds_of(raw_row):
                continue
            r = scale_runs.predict_row(raw_row)
            r.update(seq_len=raw_row["seq_len"], fsdp_like=bool(raw_row["fsdp"]))
            out.append(r)
        for r in out:
            r["error"] = float(r["error"])
            r["kind_list"] = kinds_of(r)
            r["family"] = r["kind_list"][0]
            r["scale"] = scale_of(r["gpus"])
        return out
    finally:
        cluster_ops.MOE_HOST_PER_LOCAL_EXPERT = saved


@lru_cache(maxsize=1)
def loso_rows() -> tuple:
    """Every expressible row with its within-source prediction (``error``: the shipped terms, fitted on the fit
    halves) and its LOSO prediction (``loso_error``: every fitted term refitted without the row's source)."""
    shipped = _rows()
    by_id = {r["id"]: r for r in shipped}
    sources = sorted({r["source"] for r in shipped})
    every = set(SOURCES) | set(sources)
    for left_out in sources:
        others = every - {left_out}
        fits = {name: t["fit"](others) for name, t in FITTED_TERMS.items()}
        value = fits["MOE_HOST_PER_LOCAL_EXPERT"]
        value = FITTED_TERMS["MOE_HOST_PER_LOCAL_EXPERT"]["unfitted"] if value is None else value
        fitted_from = {name: sorted({src for _, src, _ in _moe_ratios() if src in others}) for name in FITTED_TERMS}
        redo = (
            {r["id"]: r for r in _rows(moe_host=value, only_moe=True)}
            if any(r["family"] == "moe" for r in shipped if r["source"] == left_out)
            else {}
        )
        for r in shipped:
            if r["source"] != left_out:
                continue
            again = redo.get(r["id"], r)
            r["loso_error"] = again["error"]
            r["loso_predicted"] = again["predicted"]
            r["loso_terms"] = {
                name: dict(value=value, fitted_on=fitted_from[name] or ["none: unfitted value"])
                for name in FITTED_TERMS
            }
    _add_intervals(list(by_id.values()))
    return tuple(shipped)


def _weighted_quantiles(values: list[float], weights: list[float], qs: tuple[float, ...]) -> list[float]:
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    out = []
    for q in qs:
        acc = 0.0
        for v, w in pairs:
            acc += w
            if acc >= q * total:
                out.append(v)
                break
        else:
            out.append(pairs[-1][0])
    return out


def _band(pool: list[dict]) -> tuple[float, float] | None:
    """(low, high) quantiles of log(predicted / measured) over ``pool``, each source weighted equally."""
    if not pool:
        return None
    counts: dict = {}
    for r in pool:
        counts[r["source"]] = counts.get(r["source"], 0) + 1
    logs = [math.log1p(r["loso_error"]) for r in pool]
    weights = [1 / counts[r["source"]] for r in pool]
    tail = (1 - COVERAGE) / 2
    lo, hi = _weighted_quantiles(logs, weights, (tail, 1 - tail))
    return lo, hi


def _pool(rows, family: str, scale: str, exclude_source: str | None = None) -> tuple[list[dict], str]:
    """The LOSO residuals an interval is drawn from: the same family and scale bucket, else the family's, each
    needing :data:`MIN_POOL` runs from at least two sources (one source's residuals say nothing of another's);
    none when the family has no such pool (other than ``exclude_source``) — an interval is then not stated."""
    rows = [r for r in rows if r["source"] != exclude_source and "loso_error" in r]
    fam = [r for r in rows if r["family"] == family]
    cell = [r for r in fam if r["scale"] == scale]
    for pool, basis in ((cell, f"{family}, {scale}"), (fam, family)):
        if len(pool) >= MIN_POOL and len({r["source"] for r in pool}) >= 2:
            return pool, basis
    sources = sorted({r["source"] for r in fam})
    return [], f"none: {family} runs from {len(sources)} source{'s' * (len(sources) != 1)} ({', '.join(sources)})"


def _add_intervals(rows: list[dict]) -> None:
    """Each row's 80 % interval from the other sources' LOSO residuals of similar runs, and whether it holds (a row
    with no interval stated counts as not covered)."""
    for r in rows:
        pool, basis = _pool(rows, r["family"], r["scale"], exclude_source=r["source"])
        r["interval_basis"] = basis
        band = _band(pool)
        r["interval_log"] = band
        resid = math.log1p(r["loso_error"])
        r["covered"] = bool(band) and band[0] <= resid <= band[1]


def summary(rows=None) -> dict:
    """The headline: LOSO mean |error| and mean signed error overall, per source (each left out in turn) and per
    kind, beside the within-source test-half figure; the 80 % interval's LOSO coverage."""
    rows = list(rows or loso_rows())

    def stats(group, key="loso_error"):
        e = [r[key] for r in group]
        return dict(rows=len(e), mean_abs_error=sum(map(abs, e)) / len(e), mean_error=sum(e) / len(e))

    kinds = sorted({k for r in rows for k in r["kind_list"]})
    test = [r for r in rows if r["split"] == "test"]
    out = dict(
        rows=len(rows),
        sources={s: len([r for r in rows if r["source"] == s]) for s in sorted({r["source"] for r in rows})},
        loso=stats(rows),
        loso_source_weighted=_source_weighted(rows),
        within_source_test_half=stats(test, "error"),
        by_source={
            s: dict(
                stats([r for r in rows if r["source"] == s]),
                within=stats([r for r in rows if r["source"] == s], "error"),
            )
            for s in sorted({r["source"] for r in rows})
        },
        by_kind={k: stats([r for r in rows if k in r["kind_list"]]) for k in kinds},
        coverage=sum(r["covered"] for r in rows) / len(rows),
        coverage_where_stated=_coverage([r for r in rows if r["interval_log"]]),
        no_interval=len([r for r in rows if not r["interval_log"]]),
        coverage_by_source={
            s: sum(r["covered"] for r in rows if r["source"] == s) / len([r for r in rows if r["source"] == s])
            for s in sorted({r["source"] for r in rows})
        },
        terms={name: dict(doc=t["doc"], shipped_from=list(t["shipped_from"])) for name, t in FITTED_TERMS.items()},
    )
    return out


def _coverage(rows) -> float | None:
    return sum(r["covered"] for r in rows) / len(rows) if rows else None


def _source_weighted(rows) -> dict:
    """Mean |error| with each source weighted equally (llm-foundry's 216 rows would otherwise be most of it)."""
    by = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r["loso_error"])
    per = [sum(map(abs, e)) / len(e) for e in by.values()]
    signed = [sum(e) / len(e) for e in by.values()]
    return dict(mean_abs_error=sum(per) / len(per), mean_error=sum(signed) / len(signed), sources=len(per))


# ───────────────────────── for a new prediction (the planner, the explorers) ─────────────────────────


def family_of(model) -> str:
    return "moe" if getattr(model, "experts", 0) else "dense"


BANDS = Path(__file__).parent / "data" / "loso_bands.json"  # written by benchmarks/sim_by_source.py (bands())


def bands(rows=None) -> dict:
    """What a new prediction needs, from the LOSO rows: each (family, scale) cell's 80 % band of log(predicted /
    measured) with its basis and count, and the best MFU measured per (part, dtype). Committed as
    :data:`BANDS` so that the planner does not re-run the validation; ``tests/test_by_source.py`` checks that the
    file is what this returns."""
    rows = list(rows or loso_rows())
    cells = {}
    for family in ("dense", "moe"):
        for _, scale in SCALES:
            pool, basis = _pool(rows, family, scale)
            band = _band(pool)
            cells[f"{family}|{scale}"] = dict(band=list(band) if band else None, basis=basis, runs=len(pool))
    best = {}
    for r in rows:
        key = f"{kinds_of(r)[1]}|{'fp8' if 'fp8' in kinds_of(r) else 'bf16'}"
        if r.get("mfu_measured") and r["mfu_measured"] > best.get(key, [0.0, ""])[0]:
            best[key] = [round(float(r["mfu_measured"]), 6), r["id"]]
    cells = {k: dict(v, band=[round(x, 6) for x in v["band"]] if v["band"] else None) for k, v in cells.items()}
    return dict(cells=cells, best_mfu=best, coverage=COVERAGE)


@lru_cache(maxsize=1)
def _committed() -> dict:
    return json.loads(BANDS.read_text())


def interval(model, gpus: int, step_time: float) -> dict:
    """The 80 % interval of a predicted step time: the LOSO residuals of similar runs (every source, each weighted
    equally; :data:`BANDS`). ``low``/``high`` are step times (a step predicted too fast by the residual r runs
    exp(r) slower)."""
    cell = _committed()["cells"][f"{family_of(model)}|{scale_of(gpus)}"]
    if cell["band"] is None:
        return dict(low=None, high=None, basis=cell["basis"], runs=0)
    lo, hi = cell["band"]
    return dict(low=step_time * math.exp(lo), high=step_time * math.exp(hi), basis=cell["basis"], runs=cell["runs"])


def part_of(hardware) -> str | None:
    """The part family a preset belongs to ("a100", "hopper", "blackwell"), None for anything else (a CPU box)."""
    if not hardware.peak_flops:
        return None
    name = hardware.name.lower()
    if "a100" in name:
        return "a100"
    if any(k in name for k in ("h100", "h200", "h800")):
        return "hopper"
    return "blackwell" if any(k in name for k in ("b200", "b300", "gb200", "gb300")) else None


def best_published_mfu(hardware, dtype: str) -> tuple[float, str] | None:
    """(the best MFU any run of the set measured on this part at this dtype, its row id), or None."""
    best = _committed()["best_mfu"].get(f"{part_of(hardware)}|{'fp8' if str(dtype).startswith('fp8') else 'bf16'}")
    return tuple(best) if best else None


def plausibility(hardware, dtype: str, mfu: float | None) -> str:
    """'' or a warning: the predicted MFU is above the best any published run of the set reached on this part."""
    best = best_published_mfu(hardware, dtype)
    if mfu is None or best is None or mfu <= best[0]:
        return ""
    return (
        f"implausible: predicted MFU {mfu:.0%} is above the best published for {part_of(hardware)} {dtype} "
        f"({best[0]:.0%}, {best[1]}); the simulator is likely too optimistic here"
    )
