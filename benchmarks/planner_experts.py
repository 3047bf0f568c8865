"""The planner against what experts chose: for every published run the simulator can state (the validation set
of ``simlib.sim.runs``: llm-foundry's MPT tables, torchtitan's Llama tables, Korthikanti et al. 2022 —, and
Narayanan et al. 2021 Table 1), the planner searches the same model, cluster, global batch and sequence length
(the run's precision, attention kernel and FSDP reduce dtype held fixed) and the run's own plan is priced by the
same simulator. Reported per run: the chosen plan's predicted step over the planner's best (target: within 10 %),
and for each run where the planner claims more than 10 %, its plan and the terms that differ — either simulator
errors to look at or predictions worth stating. Run: ``python benchmarks/planner_experts.py``; writes
benchmarks/results/planner_experts.json.
"""
import os
import statistics
import time

from simlib import sim
from simlib.sim import runs
from simlib.sim.hardware import dgx_a100, dgx_h100
from simlib.sim.planner_report import why_slower

import report  # benchmarks/report.py: machine info and the JSON file

SPACE = dict(max_micro_batch=16, max_virtual_stages=4)
BUDGET_S = float(os.environ.get("PLANNER_EXPERTS_BUDGET_S", "1e9"))  # stop early (the JSON says complete=False)  # micro-batches above 16 and v > 4: not searched (time)


def cases():
    """Every stateable run, taken round-robin over the sources (a run stopped by its budget still covers each)."""
    by_source: dict = {}
    for case in _cases():
        by_source.setdefault(case[0].rsplit(" ", 1)[0].split(" #")[0], []).append(case)
    queues = list(by_source.values())
    while any(queues):
        for q in queues:
            if q:
                yield q.pop(0)


def _cases():
    for row in runs.load_rows():
        if runs.why_inexpressible(row):
            continue
        hw = dgx_h100(runs.H100_SOFTWARE.get(row["source"], "today")) if row["gpu"] == "h100_80gb" else \
            runs.HARDWARE[row["gpu"]]()
        yield f"{row['source']} {row['id']}", runs.model_of(row), hw, runs.strategy_of(row)
    for i, run in enumerate(sim.published.NARAYANAN_2021_TABLE_1):
        yield f"Narayanan 2021 Table 1 #{i}", run.model(), dgx_a100(), run.strategy()


def main():
    load = os.getloadavg()
    rows, seen, t0 = [], {}, time.perf_counter()
    for name, model, hw, s in cases():
        key = (model, hw.name, s.world_size, s.global_batch, s.dtype, s.attention, s.kernels, s.reduce_dtype)
        if key not in seen:
            fixed = dict(dtype=s.dtype, attention=s.attention, kernels=s.kernels, reduce_dtype=s.reduce_dtype,
                         optimizer=s.optimizer)
            seen[key] = sim.plan(model, hw, devices=s.world_size, global_batch=s.global_batch,
                                 space={**SPACE, "fixed": fixed}, check=1)
        result = seen[key]
        chosen = sim.predict(model, hw, s)
        row = dict(run=name, model=model.name, gpus=s.world_size, global_batch=s.global_batch, seq_len=model.seq_len,
                   chosen=sim.planner.label(s), chosen_step_s=chosen.step_time, chosen_fits=chosen.fits)
        if result.ranked:
            best = result.best
            entry = result.extra["pricer"].price(s, s.global_batch)
            row.update(best=sim.planner.label(best["strategy"]), best_step_s=best["step_time"],
                       chosen_over_best=chosen.step_time / best["step_time"] - 1,
                       why=why_slower(result, entry, best))
        else:
            row.update(best=None, best_step_s=None, chosen_over_best=None, why=result.nothing_fits())
        rows.append(row)
        gap = "no plan fits" if row["chosen_over_best"] is None else f"{row['chosen_over_best']:+.1%} over the best"
        print(f"{name:>40}: chosen {row['chosen']}, {gap}")
        if len(rows) % 5 == 0 or time.perf_counter() - t0 > BUDGET_S:
            write(rows, seen, t0, load, done=False)
        if time.perf_counter() - t0 > BUDGET_S:
            break
    write(rows, seen, t0, load, done=time.perf_counter() - t0 <= BUDGET_S)


def write(rows, seen, t0, load, done):
    over = [r["chosen_over_best"] for r in rows if r["chosen_over_best"] is not None]
    within = sum(o <= 0.10 for o in over)
    summary = dict(runs=len(rows), searched=len(seen), compared=len(over), within_10pct=within,
                   complete=done, median_over_best=statistics.median(over) if over else None,
                   quartiles=statistics.quantiles(over, n=4) if len(over) > 1 else None,
                   worst=max(over) if over else None, seconds=time.perf_counter() - t0,
                   planner_claims_more_than_10pct=[dict(run=r["run"], chosen=r["chosen"], best=r["best"],
                                                        over=r["chosen_over_best"], why=r["why"])
                                                   for r in rows if r["chosen_over_best"] and r["chosen_over_best"] > 0.10])
    print(f"{within}/{len(over)} chosen plans within 10 % of the planner's best" + (
        f"; median {summary['median_over_best']:+.1%}" if over else ""))
    out = dict(benchmark="planner_experts", machine=report.machine(load), space=SPACE, summary=summary, rows=rows)
    print(f"wrote {report.write(out)}")


if __name__ == "__main__":
    main()
