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

**Intervals** (:func:`_band`): a new source's error is its own offset (one value for all its runs: its stack,
recipe and way of measuring) plus its runs' scatter about it. A prediction's 80 % interval is the predictive interval
of that random-effects model over the LOSO log residuals log(predicted / measured) of similar runs: the per-source
offsets' mean and spread (each source one value) plus the within-source scatter of runs of the same family (dense or
MoE) and scale bucket, Student's t with k − 1 degrees of freedom for k sources. A family with runs from fewer than
two sources takes every family's (the pooled fallback, named in the basis); a scale bucket with fewer than
:data:`MIN_POOL` runs takes the family's scatter. When the interval is itself scored it is strictly out of source
and nested: for a run of source S, only the other sources' residuals, each with every term refitted without S too.
(The 10th–90th percentile of the pooled residuals it replaced covered 59 %: within-source scatter, dominated by one
large source, is narrower than a new source's offset.)

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
    "nemo-long-context": "NVIDIA NeMo performance_long_sequence.md (Llama 3 8B FP8 on B200, Llama 2 7B FP8 on H100, CP)",
    "nemo-perf-summary": "NVIDIA NeMo 24.07 performance_summary.md (Llama 2/3 FP8 on H100)",
}
MIN_POOL = 10  # residuals an interval's cell needs before it is used (else the family's, else every one)
COVERAGE = 0.80  # the interval's nominal coverage
SCALES = ((64, "≤64 GPUs"), (1024, "65–1,024 GPUs"), (math.inf, ">1,024 GPUs"))


@lru_cache(maxsize=1)
def _moe_ratios() -> tuple[tuple[str, str, float], ...]:
    """The MoE rows' host-time ratios (the data's, whoever is left out: a refit only filters them by source). Once:
    each costs a prediction of every MoE row, and loso_rows asks for a fit ~3,000 times (395 s uncached)."""
    from .scale_runs import moe_host_ratios

    return tuple(moe_host_ratios())


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


def _term_value(excluded: set[str], every: set[str]) -> float:
    """The MoE host term fitted on every source but ``excluded`` (its unfitted value when they hold no MoE row)."""
    value = FITTED_TERMS["MOE_HOST_PER_LOCAL_EXPERT"]["fit"](every - excluded)
    return FITTED_TERMS["MOE_HOST_PER_LOCAL_EXPERT"]["unfitted"] if value is None else value


@lru_cache(maxsize=1)
def loso_rows() -> tuple:
    """Every expressible row with its within-source prediction (``error``: the shipped terms, fitted on the fit
    halves), its LOSO prediction (``loso_error``: every fitted term refitted without the row's source) and its
    nested residuals (``nested_error``: {source S: the error with every term refitted without S *and* the row's
    source}, what an interval scored on S's runs may use: nothing of S reaches it, not even through a term)."""
    shipped = _rows()
    sources = sorted({r["source"] for r in shipped})
    every = set(SOURCES) | set(sources)
    moe_sources = {r["source"] for r in shipped if r["family"] == "moe"}
    cache: dict = {}

    def error_with(row, excluded: set[str]) -> tuple[float, float, float]:
        """(error, predicted, term value) of ``row`` with the terms fitted on every source but ``excluded``."""
        value = _term_value(excluded, every)
        if row["family"] != "moe":
            return row["error"], row["predicted"], value
        if value not in cache:  # one MoE pass per distinct fitted value
            cache[value] = {r["id"]: r for r in _rows(moe_host=value, only_moe=True)}
        again = cache[value][row["id"]]
        return again["error"], again["predicted"], value

    for r in shipped:
        left_out = r["source"]
        r["loso_error"], r["loso_predicted"], value = error_with(r, {left_out})
        r["loso_terms"] = {
            name: dict(value=value, fitted_on=sorted(moe_sources - {left_out}) or ["none: unfitted value"])
            for name in FITTED_TERMS
        }
        r["nested_error"] = {s: error_with(r, {left_out, s})[0] for s in sources if s != left_out}
    _add_intervals(shipped)
    return tuple(shipped)


@lru_cache(maxsize=64)
def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p > 0.5) by bisection on its CDF (Simpson's rule over the density); no scipy."""

    def cdf(x: float, n: int = 200) -> float:
        c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
        f = lambda t: c * (1 + t * t / df) ** (-(df + 1) / 2)  # noqa: E731
        h = x / n
        return 0.5 + h / 3 * sum((1 if i in (0, n) else 4 if i % 2 else 2) * f(i * h) for i in range(n + 1))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _mad_factor(n: int) -> float:
    """The small-sample correction of the median absolute deviation as an estimate of a normal's deviation (Croux and
    Rousseeuw 1992, "Time-efficient algorithms for two highly robust estimators of scale", their b_n: 1.4826 · MAD is
    biased low for few values); n/(n − 0.8) past their table."""
    table = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
    return table.get(n, n / (n - 0.8))


def _band(pool: list[dict], cell: list[dict], key) -> dict | None:
    """The 80 % band of log(predicted / measured) for a run of a source none of ``pool`` comes from.

    A new source's error is its own offset (its stack, recipe and way of measuring: one value for all its runs) plus
    the scatter of its runs about it. So: the offsets are the per-source means of ``pool``'s log residuals (each
    source one value, however many runs it has): their centre ``mu`` and spread ``tau``, robustly — the median and
    1.4826 × the median absolute deviation over the k sources, corrected for few values (:func:`_mad_factor`: a
    normal's deviation when the offsets are normal), so
    that one source far off the others (NeMo's 2024 H100 pages, +36 %) does not set every other source's band: with
    the mean and sample deviation the band covered 93 % of left-out runs at a median width of 45 %; this way 86 %
    at 31 % (chosen after seeing both: the nested scoring below is the same for each); the scatter ``sigma`` is the
    within-source deviation, pooled over the sources of ``cell`` (the runs of the same family and scale). The band is
    mu ± t(0.9, k − 1) · sqrt(tau² (1 + 1/k) + sigma²): the predictive interval of a random-effects model, Student's
    t because tau is estimated from k sources only."""
    by: dict = {}
    for r in pool:
        by.setdefault(r["source"], []).append(key(r))
    k = len(by)
    if k < 2:
        return None
    means = [statistics.fmean(v) for v in by.values()]
    mu = statistics.median(means)
    tau2 = (_mad_factor(k) * 1.4826 * statistics.median([abs(x - mu) for x in means])) ** 2
    within: dict = {}
    for r in cell:
        within.setdefault(r["source"], []).append(key(r))
    spreads = [statistics.pvariance(v) for v in within.values() if len(v) > 1]
    sigma2 = statistics.fmean(spreads) if spreads else 0.0
    half = _t_quantile(1 - (1 - COVERAGE) / 2, k - 1) * math.sqrt(tau2 * (1 + 1 / k) + sigma2)
    return dict(band=(mu - half, mu + half), sources=k, mu=mu, tau=math.sqrt(tau2), sigma=math.sqrt(sigma2))


def _pool(rows, family: str, scale: str, exclude_source: str | None = None) -> tuple[list[dict], list[dict], str]:
    """(pool, cell, basis): the runs an interval is drawn from, none of ``exclude_source``. The pool: the same
    family's runs when they come from at least two sources, else every family's (the pooled fallback: the basis
    says so). The cell, for the within-source scatter: the pool's runs at the same scale when they number
    :data:`MIN_POOL` from at least two sources, else the pool."""
    rows = [r for r in rows if r["source"] != exclude_source]
    fam = [r for r in rows if r["family"] == family]
    fam_sources = sorted({r["source"] for r in fam})
    if len(fam_sources) >= 2:
        pool, basis = fam, family
    else:
        pool = rows
        basis = (
            f"every family ({family} runs from {len(fam_sources)} other source{'s' * (len(fam_sources) != 1)}"
            f"{': ' + ', '.join(fam_sources) if fam_sources else ''})"
        )
    cell = [r for r in pool if r["scale"] == scale]
    if len(cell) >= MIN_POOL and len({r["source"] for r in cell}) >= 2:
        return pool, cell, f"{basis}; scatter of {scale}"
    return pool, pool, f"{basis}; scatter of every scale"


def _add_intervals(rows: list[dict]) -> None:
    """Each row's 80 % interval from the other sources only, nested: the pool's residuals are theirs with every
    term refitted without them *and* without the row's source (``nested_error``); whether it holds (a row with no
    interval stated counts as not covered)."""
    for r in rows:
        src = r["source"]
        pool, cell, basis = _pool(rows, r["family"], r["scale"], exclude_source=src)
        band = _band(pool, cell, key=lambda x: math.log1p(x["nested_error"][src]))  # noqa: B023
        r["interval_basis"] = basis
        r["interval_log"] = band["band"] if band else None
        resid = math.log1p(r["loso_error"])
        r["covered"] = bool(band) and band["band"][0] <= resid <= band["band"][1]


def summary(rows=None) -> dict:
    """The headline: LOSO mean |error| and mean signed error overall, per source (each left out in turn) and per
    kind, beside the within-source test-half figure; the 80 % interval's LOSO coverage."""
    rows = list(rows or loso_rows())

    def stats(group, key="loso_error"):
        e = [r[key] for r in group]
        return dict(rows=len(e), mean_abs_error=sum(map(abs, e)) / len(e), mean_error=sum(e) / len(e))

    kinds = sorted({k for r in rows for k in r["kind_list"]})
    test = [r for r in rows if r["split"] == "test"]
    stated = [r for r in rows if r["interval_log"]]
    widths = [math.exp(r["interval_log"][1]) - math.exp(r["interval_log"][0]) for r in stated]
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
        # each kind split by family: a kind's sign may be its MoE runs' alone (the one term with one source)
        by_kind_and_family={
            k: {
                f: stats([r for r in rows if k in r["kind_list"] and r["family"] == f])
                for f in ("dense", "moe")
                if any(k in r["kind_list"] and r["family"] == f for r in rows)
            }
            for k in kinds
        },
        coverage=sum(r["covered"] for r in rows) / len(rows),
        coverage_where_stated=_coverage([r for r in rows if r["interval_log"]]),
        no_interval=len([r for r in rows if not r["interval_log"]]),
        coverage_by_source={
            s: sum(r["covered"] for r in rows if r["source"] == s) / len([r for r in rows if r["source"] == s])
            for s in sorted({r["source"] for r in rows})
        },
        coverage_by_kind={k: _coverage([r for r in rows if k in r["kind_list"]]) for k in kinds},
        # the interval's width as a share of the prediction (high − low over the predicted value), median over runs
        interval_median_width=statistics.median(widths) if widths else None,
        interval_median_width_by_kind={
            k: statistics.median([w for r, w in zip(stated, widths) if k in r["kind_list"]] or [math.nan])
            for k in kinds
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
    measured) (:func:`_band` over every source's LOSO residuals) with its basis, its runs, sources, offset spread
    ``tau`` and scatter ``sigma``, and the best MFU measured per (part, dtype). Committed as :data:`BANDS` so that
    the planner does not re-run the validation; ``tests/test_by_source.py`` checks that the file is what this
    returns."""
    rows = list(rows or loso_rows())
    cells = {}
    for family in ("dense", "moe"):
        for _, scale in SCALES:
            pool, cell, basis = _pool(rows, family, scale)
            band = _band(pool, cell, key=lambda r: math.log1p(r["loso_error"]))
            cells[f"{family}|{scale}"] = dict(
                band=[round(x, 6) for x in band["band"]] if band else None,
                basis=basis,
                runs=len(pool),
                **({k: round(band[k], 6) for k in ("sources", "mu", "tau", "sigma")} if band else {}),
            )
    best = {}
    for r in rows:
        key = f"{kinds_of(r)[1]}|{'fp8' if 'fp8' in kinds_of(r) else 'bf16'}"
        if r.get("mfu_measured") and r["mfu_measured"] > best.get(key, [0.0, ""])[0]:
            best[key] = [round(float(r["mfu_measured"]), 6), r["id"]]
    return dict(cells=cells, best_mfu=best, coverage=COVERAGE)


@lru_cache(maxsize=1)
def _committed() -> dict:
    return json.loads(BANDS.read_text())


def interval(model, gpus: int, step_time: float) -> dict:
    """The 80 % interval of a predicted step time: the LOSO residuals of similar runs, a source's offset and its
    runs' scatter (:func:`_band` over every source; :data:`BANDS`). ``low``/``high`` are step times (a step predicted too fast by the residual r runs
    exp(r) slower)."""
    return interval_of(family_of(model), gpus, step_time)


def interval_of(family: str, gpus: int, step_time: float) -> dict:
    """:func:`interval` by family ("dense" or "moe") rather than model."""
    cell = _committed()["cells"][f"{family}|{scale_of(gpus)}"]
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
