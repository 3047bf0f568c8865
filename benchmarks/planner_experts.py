"""The planner against what experts chose: for every published run the simulator can state — its first validation
set (``simlib.sim.runs``: llm-foundry's MPT tables, torchtitan's Llama tables, Narayanan et al. 2021 Table 1) and
its cluster-scale set (``simlib.sim.scale_runs``: Megatron-Bridge's 25.11/26.02 tables, Llama 3 Table 4; MoE with
ep, long context with cp, Blackwell, FP8) — the planner searches the same model, cluster, global batch and
sequence length (the run's precision, FP8 recipe, attention kernel, expert dispatcher, FSDP reduce dtype and rank order held fixed),
and the run's own plan is priced by the same simulator. Reported per run: the chosen plan's predicted step over the
planner's best, its rank (exact within the top ``TOP``), each plan ranked above it with its 80 % interval and the term
it wins by, and whether the chosen plan is tied with the best (their intervals overlap: ``simlib.sim.
planner_uncertainty``; issue 52's target: tied for >= 80 % of runs); per source and per kind, and for each run where
the planner claims more than 10 %, its plan and the terms that differ.

Each search is ``plan(..., top=TOP)``: layouts visited by a lower bound on their step time and stopped past the
TOP-th (the same top plans as the full search, tests/test_planner.py). What the planner does not search but a run uses
(Megatron's EP all-to-all overlap, recomputed modules, activation offloading, DeepSeek-V3's uneven pipeline
layout) is priced for the run's plan only; the JSON names it on the row (``run_only``).
Run: ``python benchmarks/planner_experts.py``; writes benchmarks/results/planner_experts.json (after every search, so
a run stopped early keeps its rows). ``python benchmarks/planner_experts.py --retie`` re-judges the stored rows' ties
with the bands committed now (after ``benchmarks/sim_by_source.py`` rewrote them), without searching again.
"""

import multiprocessing
import os
import statistics
import time

import report  # benchmarks/report.py: machine info and the JSON file

from simlib import sim
from simlib.sim import runs, scale_runs
from simlib.sim.hardware_presets import dgx_a100, dgx_h100
from simlib.sim.model_zoo import llama_size
from simlib.sim.planner_report import why_slower

SPACE = dict(max_micro_batch=16, max_virtual_stages=4)  # micro-batches above 16 not searched (time); v up to 4,
# or the run's own v where it is larger
BUDGET_S = float(os.environ.get("PLANNER_EXPERTS_BUDGET_S", "1e9"))  # stop early (the JSON says complete=False)
TOP = int(os.environ.get("PLANNER_EXPERTS_TOP", "20"))  # the plans ranked exactly: the chosen plan's rank is exact
# when it is among them (else "> TOP"), and each plan above it is reported with the term it wins by
WORKERS = int(os.environ.get("PLANNER_EXPERTS_WORKERS", "4"))  # searches in parallel (at nice 19 on a shared box)


def cases():
    """Every stateable run, taken round-robin over the sources (a run stopped by its budget still covers each)."""
    by_source: dict = {}
    for case in _cases():
        by_source.setdefault(case["source"], []).append(case)
    queues = list(by_source.values())
    while any(queues):
        for q in queues:
            if q:
                yield q.pop(0)


def _cases():
    for row in runs.load_rows():
        if runs.why_inexpressible(row):
            continue
        hw = (
            dgx_h100(runs.H100_SOFTWARE.get(row["source"], "today"))
            if row["gpu"] == "h100_80gb"
            else runs.HARDWARE[row["gpu"]]()
        )
        yield dict(
            run=f"{row['source']} {row['id']}",
            set="validation",
            source=row["source"],
            kinds=["dense"],
            model=runs.model_of(row),
            hw=hw,
            strategy=runs.strategy_of(row),
        )
    for i, run in enumerate(sim.published.NARAYANAN_2021_TABLE_1):
        yield dict(
            run=f"Narayanan 2021 Table 1 #{i}",
            set="validation",
            source="Narayanan 2021",
            kinds=["dense"],
            model=run.model(),
            hw=dgx_a100(),
            strategy=run.strategy(),
        )
    for row in scale_runs.load_rows():
        if scale_runs.why_inexpressible(row):
            continue
        model = llama_size(row["model"], seq_len=row["seq_len"])
        kinds = scale_runs.kinds_of(row)
        yield dict(
            run=row["id"],
            set="scale",
            source=row["source"],
            kinds=kinds if "moe" in kinds else ["dense"] + kinds,
            model=model,
            hw=scale_runs.hardware_of(row),
            strategy=scale_runs.strategy_of(row, model),
        )


def run_only(s) -> list:
    """What the run's plan uses that the planner does not search."""
    out = []
    if s.ep_overlap:
        out.append("EP all-to-all overlap")
    if s.recompute_modules:
        out.append("recomputes " + "+".join(s.recompute_modules))
    if s.offload_layers:
        out.append(f"offloads {s.offload_layers} layers")
    if s.stage_layout:
        out.append("uneven pipeline layout")
    return out


def compare(indexed: list) -> list:
    """One search (the cases share model, cluster, batch and the fixed fields) and a row per case."""
    rows, result = [], None
    for index in indexed:
        case = CASES[index]
        model, hw, s = case["model"], case["hw"], case["strategy"]
        if result is None:
            fixed, space = search_space(s)
            result = sim.plan(
                model, hw, devices=s.world_size, global_batch=s.global_batch, space=space, check=1, top=TOP
            )
        chosen = sim.predict(model, hw, s)
        row = dict(
            run=case["run"],
            set=case["set"],
            source=case["source"],
            kinds=case["kinds"],
            model=model.name,
            gpu=hw.name,
            gpus=s.world_size,
            global_batch=s.global_batch,
            seq_len=model.seq_len,
            chosen=sim.planner.label(s),
            run_only=run_only(s),
            chosen_step_s=chosen.step_time,
            chosen_fits=chosen.fits,
            chosen_memory_gb=chosen.memory["total"] / 1e9,
            memory_limit_gb=result.memory_limit / 1e9,
            search_s=result.seconds,
        )
        if result.ranked:
            best = result.best
            entry = result.extra["pricer"].price(s, s.global_batch)
            row.update(
                best=sim.planner.label(best["strategy"]),
                best_step_s=best["step_time"],
                best_memory_gb=best["memory"]["total"] / 1e9,
                chosen_over_best=chosen.step_time / best["step_time"] - 1,
                why=why_slower(result, entry, best),
                **rank_and_ties(result, entry),
            )
        else:
            row.update(best=None, best_step_s=None, chosen_over_best=None, why=result.nothing_fits())
        rows.append(row)
    return rows


def rank_and_ties(result, chosen: dict) -> dict:
    """The chosen plan's rank among the ranked plans (exact when it is within the top ``TOP``), each plan ranked
    above it with its 80 % interval and the term it wins by (``why_slower``: what makes the chosen plan slower),
    and whether the chosen plan's interval overlaps the best's (a tie: the planner cannot tell them apart)."""
    from simlib.sim.planner_uncertainty import interval

    above = [e for e in result.ranked if e["step_time"] < chosen["step_time"] * (1 - 1e-9)]
    exact = len(above) < len(result.ranked) or result.top is None or len(result.ranked) < result.top
    mine, top = interval(result, chosen), interval(result, result.best)
    tied = None if mine["low"] is None else mine["low"] <= top["high"]

    def band(e):
        b = interval(result, e)
        return None if b["low"] is None else [b["low"], b["high"]]

    return dict(
        chosen_rank=len(above) + 1 if exact else None,
        chosen_rank_at_least=len(above) + 1,
        chosen_interval=band(chosen),
        best_interval=band(result.best),
        interval_basis=mine["basis"],
        tied_with_best=tied,
        above=[
            dict(
                plan=sim.planner.label(e["strategy"]),
                step_s=e["step_time"],
                interval=band(e),
                tied_with_chosen=None if mine["low"] is None else interval(result, e)["high"] >= mine["low"],
                wins_by=why_slower(result, chosen, e),
            )
            for e in above[:TOP]
        ],
    )


def search_space(s):
    fixed = dict(
        dtype=s.dtype,
        attention=s.attention,
        kernels=s.kernels,
        reduce_dtype=s.reduce_dtype,
        optimizer=s.optimizer,
        fp8_recipe=s.fp8_recipe,
        pipeline_outer=s.pipeline_outer,
        ep_dispatcher=s.ep_dispatcher,
    )
    space = {**SPACE, "max_virtual_stages": max(SPACE["max_virtual_stages"], s.virtual_stages), "fixed": fixed}
    if s.param_gather_overlap:  # the run's framework overlaps the distributed optimizer's all-gather: so may the plans,
        space["param_gather_overlap"] = (True,)  # with its gradient buckets
        fixed["bucket_bytes"] = s.bucket_bytes
    return fixed, space


CASES = list(cases())


def main():
    load = os.getloadavg()
    groups: dict = {}  # one search per distinct (model, cluster, world, batch, fixed fields, space)
    for i, case in enumerate(CASES):
        s = case["strategy"]
        fixed, space = search_space(s)
        key = (
            case["model"],
            case["hw"].name,
            s.world_size,
            s.global_batch,
            tuple(sorted(fixed.items())),
            space["max_virtual_stages"],
            space.get("param_gather_overlap"),
        )
        groups.setdefault(key, []).append(i)
    rows, t0, n = [], time.perf_counter(), 0
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        for n, got in enumerate(pool.imap(compare, groups.values()), 1):
            rows += got
            for row in got:
                gap = (
                    "no plan fits"
                    if row["chosen_over_best"] is None
                    else f"{row['chosen_over_best']:+.1%} over the best"
                )
                print(f"{row['run']:>40}: chosen {row['chosen']}, {gap} ({row['search_s']:.0f} s)", flush=True)
            over_budget = time.perf_counter() - t0 > BUDGET_S
            write(rows, n, t0, load, done=False)  # after every search: a run stopped from outside keeps its rows
            if over_budget:
                pool.terminate()
                break
    write(rows, n, t0, load, done=len(rows) == len(CASES))


def stats(rows) -> dict:
    over = [r["chosen_over_best"] for r in rows if r["chosen_over_best"] is not None]
    return dict(
        runs=len(rows),
        compared=len(over),
        within_10pct=sum(o <= 0.10 for o in over),
        tied_with_best=sum(bool(r.get("tied_with_best")) for r in rows),
        no_interval=sum(r.get("tied_with_best") is None for r in rows),
        median_over_best=statistics.median(over) if over else None,
        quartiles=statistics.quantiles(over, n=4) if len(over) > 1 else None,
        worst=max(over) if over else None,
        chosen_does_not_fit=sum(not r["chosen_fits"] for r in rows),
    )


def retie(path=None):
    """Re-judge the stored searches' intervals and ties with the bands committed now (``simlib/sim/data/
    loso_bands.json``, rewritten by ``benchmarks/sim_by_source.py``): a plan's interval is its step time times its
    cell's band (family, scale), so the searches need not run again when the validation set grows."""
    import json
    import pathlib

    from simlib.sim import by_source

    by_source._committed.cache_clear()
    path = pathlib.Path(path or pathlib.Path(__file__).parent / "results" / "planner_experts.json")
    data = json.loads(path.read_text())

    def band(row, step):
        b = by_source.interval_of("moe" if "moe" in row["kinds"] else "dense", row["gpus"], step)
        return b, (None if b["low"] is None else [b["low"], b["high"]])

    for row in data["rows"]:
        if row.get("best_step_s") is None:
            continue
        (mine, row["chosen_interval"]), (top, row["best_interval"]) = (
            band(row, row["chosen_step_s"]),
            band(row, row["best_step_s"]),
        )
        row["interval_basis"] = mine["basis"]
        row["tied_with_best"] = None if mine["low"] is None else mine["low"] <= top["high"]
        for e in row.get("above", []):
            b, e["interval"] = band(row, e["step_s"])
            e["tied_with_chosen"] = None if mine["low"] is None else b["high"] >= mine["low"]
    old = data["summary"]
    write(
        data["rows"],
        old["searched"],
        None,
        None,
        old["complete"],
        seconds=old["seconds"],
        machine=data["machine"],
        note=f"ties re-judged {time.strftime('%Y-%m-%d %H:%M')} with the committed loso_bands.json (retie)",
    )


def write(rows, searched, t0, load, done, seconds=None, machine=None, note=None):
    groups = lambda key: {
        g: stats([r for r in rows if g in key(r)])  # noqa: E731
        for g in sorted({g for r in rows for g in key(r)})
    }
    claims = [r for r in rows if r["chosen_over_best"] and r["chosen_over_best"] > 0.10]
    summary = dict(
        **stats(rows),
        searched=searched,
        complete=done,
        seconds=time.perf_counter() - t0 if seconds is None else seconds,
        **({"note": note} if note else {}),
        search_seconds_summed=sum(r["search_s"] for r in rows),
        workers=WORKERS,
        top=TOP,
        by_set=groups(lambda r: [r["set"]]),
        by_source=groups(lambda r: [r["source"]]),
        by_kind=groups(lambda r: r["kinds"]),
        planner_claims_more_than_10pct=[
            dict(
                run=r["run"],
                chosen=r["chosen"],
                best=r["best"],
                over=r["chosen_over_best"],
                why=r["why"],
                run_only=r["run_only"],
            )
            for r in claims
        ],
    )
    print(
        f"{summary['tied_with_best']}/{summary['compared']} chosen plans tied with the planner's best (80 % "
        f"intervals overlap; {summary['no_interval']} with no interval); "
        f"{summary['within_10pct']}/{summary['compared']} chosen plans within 10 % of the planner's best"
        + (f"; median {summary['median_over_best']:+.1%}" if summary["compared"] else "")
    )
    out = dict(
        benchmark="planner_experts", machine=machine or report.machine(load), space=SPACE, summary=summary, rows=rows
    )
    print(f"wrote {report.write(out)}")


if __name__ == "__main__":
    import sys

    retie() if sys.argv[1:] == ["--retie"] else main()
