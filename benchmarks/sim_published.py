"""The simulator against published GPU-cluster runs: the broad validation (every run of four sources) and, in
detail, Narayanan et al. 2021 (Megatron-LM), Table 1.

    .venv/bin/python benchmarks/sim_published.py          # a few seconds: pure arithmetic, no GPU needed

Writes benchmarks/results/sim_published.json: every Table 1 row (1.7B .. 1T parameters, 32 .. 3,072 A100s)
predicted with the DGX A100 preset and compared with the published TFLOP/s per GPU; the mean and max absolute
error (target: mean <= 10 %, every row expressible); the published nccl-tests bus-bandwidth points beside the
link model; an independent check on a second set of published runs (Korthikanti et al. 2022, iteration times
with full and with selective recomputation + sequence parallelism); and an ablation — both tables with one
modelling choice changed at a time — so that what each term is worth is on the record. Sources and the figures that could not be checked: ``simlib.sim.published``.

The broad validation (``simlib.sim.runs``): every run of ``simlib/sim/data/published_runs.csv`` (llm-foundry's MPT
tables, torchtitan's Llama tables) and the two Megatron-LM sets, predicted; per source and per half (fit/test, split
by a fixed rule before any error was computed) the mean and max |error|, the runs reported as not fitting in memory,
errors by sequence length and by model size, the rows the simulator cannot state with the reason, an ablation of the
new modelling choices, and Calculon's errors on the same rows where ``benchmarks/sim_calculon.py`` could state them
(read from ``benchmarks/results/sim_calculon.json``; Calculon is not a dependency).
"""

import os
import time

import report  # benchmarks/report.py: machine info and the JSON file

TARGET = 0.10


def ablation(hardware):
    """Mean absolute error with one modelling choice changed at a time (the rest as in the preset), on Table 1
    and on the independent check (Korthikanti et al. 2022)."""
    from simlib.sim import hardware as H
    from simlib.sim.published import korthikanti_table, published_table

    variants = {
        "as modelled (preset)": hardware,
        "GEMM: Calculon's table as published (95 % of peak for large GEMMs), roofline": hardware.with_(
            gemm_table={"bf16": H.CALCULON_GEMM_EFFICIENCY}
        ),
        "GEMM: Calculon's table and Calculon's no_overlap (math + memory time)": hardware.with_(
            gemm_table={"bf16": H.CALCULON_GEMM_EFFICIENCY}, processing="no_overlap"
        ),
        "GEMM: measured anchor, no_overlap (math + memory time)": hardware.with_(processing="no_overlap"),
        "memory-bound kernels at the full HBM bandwidth (no Calculon efficiency)": hardware.with_(mem_efficiency=None),
        "memory-bound kernels free (GEMMs and communication only)": hardware.with_(
            memory_bandwidth=1e18, mem_efficiency=None
        ),
        "intra-node links: the alpha-beta fit instead of the nccl-tests curve": hardware.with_(
            intra=H.Link(hardware.intra.alpha, hardware.intra.bandwidth)
        ),
    }
    out = {}
    for name, hw in variants.items():
        table = published_table(hw)
        errors = table["error"].astype(float)
        second = korthikanti_table(hw)["error"].astype(float)
        out[name] = dict(
            mean_abs_error=float(errors.abs().mean()),
            max_abs_error=float(errors.abs().max()),
            mean_error=float(errors.mean()),
            errors=[round(float(e), 4) for e in errors],
            independent_check_mean_abs_error=float(second.abs().mean()),
            independent_check_mean_error=float(second.mean()),
        )
    return out


def broad_ablation():
    """Mean |error| per source on all expressible rows with one of the new modelling choices undone."""
    import pandas as pd

    from simlib.sim import hardware as H
    from simlib.sim import runs

    rows = runs.load_rows()

    def errors(hardware_for=None, row_edit=None):
        out = []
        for r in rows:
            r = dict(r)
            if row_edit:
                row_edit(r)
            hw = hardware_for(r) if hardware_for else None
            p = runs.predict_row(r, hw) if not runs.why_inexpressible(r) else None
            if p:
                out.append(dict(source=r["source"], gpu=r["gpu"], error=p["error"], fits=p["fits"]))
        t = pd.DataFrame(out)
        t["abs"] = t.error.abs()
        return dict(
            by_source={k: round(float(v), 4) for k, v in t.groupby("source")["abs"].mean().items()},
            h100_mean_abs_error=round(float(t[t.gpu == "h100_80gb"]["abs"].mean()), 4),
            not_fitting=int((~t.fits.astype(bool)).sum()),
        )

    def today_h100(r):
        return H.dgx_h100("today") if r["gpu"] == "h100_80gb" else None

    def gigabytes(r):  # capacity as 80e9 / 40e9 bytes instead of GiB
        if r["gpu"] not in runs.HARDWARE:
            return None
        hw = runs.HARDWARE[r["gpu"]]() if r["gpu"] != "h100_80gb" else H.dgx_h100("2023")
        return hw.with_(memory_bytes=hw.memory_bytes / 2**30 * 1e9)

    def unfused(r):
        r["attention"] = "unfused"

    def fa2_everywhere(r):
        r["attention"] = "flash"

    return {
        "as modelled": errors(),
        "H100 GEMMs at today's best matmul (780 TFLOP/s) instead of 2023's 549.5": errors(today_h100),
        "GPU capacity 80e9/40e9 bytes instead of 80/40 GiB": errors(gigabytes),
        "attention unfused (s x s scores through memory), as before": errors(row_edit=unfused),
        "every MPT run on FlashAttention-2 (ignoring the Triton kernel its script ran)": errors(
            row_edit=fa2_everywhere
        ),
    }


def broad(result: dict):
    """The broad validation into ``result["broad"]``; prints the per-source summary."""
    import collections
    import json
    import pathlib

    import numpy as np

    from simlib.sim import runs

    table = runs.validation_table()
    ok = table[table.expressible].copy()
    ok["abs_error"] = ok["error"].astype(float).abs()
    summary = runs.summary(table)
    halves = {
        split: dict(
            rows=int(len(g)),
            mean_abs_error=float(g.abs_error.mean()),
            max_abs_error=float(g.abs_error.max()),
            not_fitting=int((~g.fits.astype(bool)).sum()),
        )
        for split, g in ok.groupby("split")
    }
    seq_bins = [0, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    ok["seq_bin"] = [min(b for b in seq_bins if b >= s) for s in ok.seq_len]
    size_bins = [(0, 1), (1, 10), (10, 50), (50, 2000)]
    ok["size_bin"] = [next(f"{lo}-{hi}B" for lo, hi in size_bins if lo <= p < hi) for p in ok.params_b]
    by = {
        k: {
            str(g): dict(
                rows=int(len(x)),
                mean_abs_error=float(x.abs_error.mean()),
                mean_error=float(x["error"].astype(float).mean()),
            )
            for g, x in ok.groupby(k)
        }
        for k in ("seq_bin", "size_bin", "gpu")
    }
    calculon_path = pathlib.Path(__file__).parent / "results" / "sim_calculon.json"
    peer = None
    if calculon_path.exists():
        cal = {r["id"]: r for r in json.loads(calculon_path.read_text())["rows"]}
        both = ok[[cal.get(i, {}).get("calculon") is not None for i in ok.id]].copy()
        both["calculon_error"] = [cal[i]["error"] for i in both.id]
        both["exact"] = [cal[i]["exact"] for i in both.id]
        peer = dict(
            source="benchmarks/results/sim_calculon.json (benchmarks/sim_calculon.py)",
            rows_stated=int(len(both)),
            rows_total=int(len(table)),
            not_stated=dict(
                collections.Counter(
                    "Calculon says it does not fit in memory (it has no FSDP weight sharding and keeps the "
                    "s x s attention scores)"
                    if "Mem tier1" in (c["reason"] or "")
                    else c["reason"]
                    for c in cal.values()
                    if c["calculon"] is None
                )
            ),
            groups={},
        )
        for name, g in (
            ("Megatron rows (stated exactly)", both[both.exact]),
            ("FSDP rows (stated approximately)", both[~both.exact]),
        ):
            if len(g):
                peer["groups"][name] = dict(
                    rows=int(len(g)),
                    simlib_mean_abs_error=float(g.abs_error.mean()),
                    calculon_mean_abs_error=float(np.abs(g.calculon_error).mean()),
                )
        peer["rows"] = both[["id", "source", "split", "error", "calculon_error", "exact"]].to_dict(orient="records")
    result["broad"] = {
        "source_file": "simlib/sim/data/published_runs.csv + simlib.sim.published (Narayanan, Korthikanti)",
        "split_rule": "within each source, rows in file order: even positions fit, odd test (fixed before any "
        "error was computed; nothing is fitted on either half)",
        "target_mean_abs_error": TARGET,
        "rows": int(len(table)),
        "expressible": int(table.expressible.sum()),
        "halves": halves,
        "by_source": summary.to_dict(orient="records"),
        "by": by,
        "inexpressible": table[~table.expressible][["id", "source", "table", "model", "reason"]].to_dict(
            orient="records"
        ),
        "not_fitting": ok[~ok.fits.astype(bool)][["id", "model", "memory_gb"]].to_dict(orient="records"),
        "targets": {
            "held_out_mean_abs_error_met": bool(halves["test"]["mean_abs_error"] <= TARGET),
            "every_source_met": {
                str(r["group"]) + "/" + r["split"]: bool(r["mean_abs_error"] <= TARGET)
                for r in summary.to_dict(orient="records")
            },
            "no_run_reported_not_fitting": bool(ok.fits.astype(bool).all()),
        },
        "calculon": peer,
        "ablation": broad_ablation(),
        "table": table.to_dict(orient="records"),
    }
    print(summary.round(3).to_string(index=False))
    print(
        f"held-out half: mean |error| {halves['test']['mean_abs_error']:.1%} over {halves['test']['rows']} runs "
        f"(fit half {halves['fit']['mean_abs_error']:.1%}); not fitting: "
        f"{halves['test']['not_fitting'] + halves['fit']['not_fitting']}; inexpressible: "
        f"{int((~table.expressible).sum())}"
    )
    if peer:
        for name, g in peer["groups"].items():
            print(
                f"  vs Calculon, {name}: {g['rows']} rows, simlib {g['simlib_mean_abs_error']:.1%}, "
                f"Calculon {g['calculon_mean_abs_error']:.1%}"
            )
    for name, a in result["broad"]["ablation"].items():
        print(
            f"  ablation: {name}: {a['by_source']} (H100 {a['h100_mean_abs_error']:.1%}, not fitting "
            f"{a['not_fitting']})"
        )


def main() -> dict:
    from simlib import sim
    from simlib.sim.published import NARAYANAN_2021_TABLE_1, SOURCE, korthikanti_table, nccl_points, published_table

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    hardware = sim.dgx_a100()
    table = published_table(hardware)
    expressible = bool(table["predicted_tflops"].notna().all())
    errors = table["error"].astype(float)
    mae, worst = float(errors.abs().mean()), float(errors.abs().max())
    result = {
        "benchmark": "sim_published",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": report.machine(load_before, note="pure arithmetic: the load does not affect the figures"),
        "source": SOURCE,
        "hardware": {
            "preset": hardware.name,
            "source": hardware.source,
            "intra_node_link": hardware.intra.source,
            "inter_node_link": hardware.inter.source,
            "gemm_efficiency_table": hardware.gemm_table["bf16"],
            "memory_efficiency_table_MB": hardware.mem_efficiency,
            "processing": hardware.processing,
        },
        "not_checked": [
            "Published TFLOP/s per GPU, % of peak and parameter counts are transcribed from the paper's "
            "Table 1 and could not be checked against a stored copy of the paper (they are internally "
            "consistent with its aggregate PFLOP/s column; the 1T row's 502 PFLOP/s matches "
            "independent summaries). Model shapes, tp, pp, GPUs, batch sizes, micro-batch sizes, "
            "interleaving and DDP were checked against examples/sc21/run_table_1.sh.",
            "The A100 inter-node link (23 GB/s per HDR NIC, 5 us) is derived from NDR measurements, "
            "not measured on HDR.",
        ],
        "target_mean_abs_error": TARGET,
        "mean_abs_error": mae,
        "max_abs_error": worst,
        "mean_error": float(errors.mean()),
        "every_row_expressible": expressible,
        "target_met": bool(mae <= TARGET and expressible),
        "rows": table.to_dict(orient="records"),
        "nccl_tests_busbw_points": nccl_points(hardware).to_dict(orient="records"),
        "independent_check": None,
        "ablation": ablation(hardware),
        "seconds": None,
    }
    second = korthikanti_table(hardware)
    result["independent_check"] = {
        "source": "Korthikanti et al. 2022 (arXiv 2205.05198), iteration times as quoted in calculon-ai/calculon "
        "calculon/megatron/validation.py; layouts from Calculon's validation/*_{full,seqsel}.json",
        "note": "not used to build the model: a second set of published A100 runs (full recomputation; selective "
        "recomputation with sequence parallelism), compared by iteration time",
        "mean_abs_error": float(second["error"].abs().mean()),
        "max_abs_error": float(second["error"].abs().max()),
        "rows": second.to_dict(orient="records"),
    }
    broad(result)
    result["seconds"] = time.perf_counter() - t0
    out = report.write(result)
    cols = [
        "model",
        "tp",
        "pp",
        "dp",
        "gpus",
        "micro_batch",
        "virtual_stages",
        "published_tflops",
        "predicted_tflops",
        "error",
    ]
    print(table[cols].round(3).to_string(index=False))
    print(
        f"mean |error| {mae:.1%}, max {worst:.1%} over {len(NARAYANAN_2021_TABLE_1)} rows "
        f"(target {TARGET:.0%}: {'met' if result['target_met'] else 'missed'}) -> {out}"
    )
    print(second[["model", "mode", "gpus", "published_s", "predicted_s", "error"]].round(3).to_string(index=False))
    check = result["independent_check"]["mean_abs_error"]
    print(f"independent check (Korthikanti et al. 2022): mean |error| {check:.1%}")
    print("ablation: mean |error| on Table 1 / on the independent check")
    for name, a in result["ablation"].items():
        print(f"  {a['mean_abs_error']:6.1%} / {a['independent_check_mean_abs_error']:6.1%}  {name}")
    return result


if __name__ == "__main__":
    main()
