"""The peer: Calculon (calculon-ai/calculon, Isaev et al. SC'23) on the same published runs, where it can state them.

    CALCULON_HOME=/path/to/calculon .venv/bin/python benchmarks/sim_calculon.py

Calculon is not a dependency of the course (it is not on the package index): this script runs only where a copy
of its repository is on disk (``CALCULON_HOME``: the package is imported from there and its ``systems/*.json``
hardware files are read from there). It writes ``benchmarks/results/sim_calculon.json``, which
``benchmarks/sim_published.py`` and notebook 06 read, so the comparison is on the record without Calculon.

How a run is stated in Calculon's terms (its ``Llm.Application`` / ``Llm.Execution``):
- Megatron-LM rows (Narayanan 2021, Korthikanti 2022) are expressed exactly: tensor/pipeline/data degrees,
  interleaving, recomputation (full, or selective as ``attn_only``), sequence parallelism (``rs_ag`` with the
  all-gather redone), as Calculon's own validation files do.
- FSDP rows (llm-foundry, torchtitan) are expressed only approximately, and marked so: Calculon has no fused
  (Flash) attention, no per-layer weight all-gather (the closest is ZeRO-1 ``optimizer_sharding`` with data-parallel
  overlap), no gated MLP (the ffn width is kept, two matrices instead of three), no grouped-query attention
  (multi-head) and no FP8 on A100 systems. FP8 rows and hardware it has no file for are left out with the reason.
- Hardware: Calculon's ``systems/a100_80g.json`` and ``h100_80g_nvl8.json`` as published; A100 40 GB is the
  80 GB file with 40 GiB at 1,555 GB/s.
"""

import json
import os
import sys
import time
from pathlib import Path

import report  # benchmarks/report.py

RECOMPUTE = {"full": "full", "none": "none", "selective": "attn_only", "op": "attn_only", "every_other": "full"}


def _system(home: Path, gpu: str):
    name = {"a100_80gb": "a100_80g.json", "a100_40gb": "a100_80g.json", "h100_80gb": "h100_80g_nvl8.json"}.get(gpu)
    if name is None:
        return None
    cfg = json.loads((home / "systems" / name).read_text())
    if gpu == "a100_40gb":
        cfg["mem1"]["GiB"], cfg["mem1"]["GBps"] = 40, 1555
    return cfg


def _state(row, source_row):
    """(application, execution, exact?) for one row of ``simlib.sim.runs.validation_table``, or a reason."""
    if row["precision"] in ("amp_fp8", "fp8"):
        return "FP8 training is not in Calculon's LLM model as run here"
    if source_row is None:  # a Megatron row: its own objects
        return None
    r = source_row
    gpus, tp, pp = r["gpus"], r["tp"], r["pp"]
    dp = gpus // (tp * pp * r["cp"])
    app = dict(
        hidden=r["hidden"],
        feedforward=r["ffn_hidden"],
        seq_size=r["seq_len"],
        attn_heads=r["heads"],
        attn_size=r["hidden"] // r["heads"],
        num_blocks=r["layers"],
    )
    exe = dict(
        num_procs=gpus,
        tensor_par=tp,
        pipeline_par=pp,
        data_par=dp,
        tensor_par_net=0,
        pipeline_par_net=0 if tp * pp <= 8 else 1,
        data_par_net=0 if gpus <= 8 else 1,
        batch_size=r["global_batch"],
        microbatch_size=r["micro_batch"],
        datatype="float16",
        fused_activation=False,
        attention_type="multihead",
        activation_recompute=RECOMPUTE[r["recompute"] if r["recompute"] != "selective_layer" else "every_other"],
        pipeline_interleaving=1,
        optimizer_sharding=True,
        tensor_par_comm_type="ar",
        tensor_par_overlap="none",
        seq_par_ag_redo=False,
        data_par_overlap=True,
        weight_offload=False,
        activations_offload=False,
        optimizer_offload=False,
        training=True,
    )
    return app, exe, False


def _megatron_state():
    """Narayanan 2021 Table 1 and Korthikanti 2022 rows in Calculon's terms (exact), keyed by our row ids."""
    from simlib.sim.published import KORTHIKANTI_2022, NARAYANAN_2021_TABLE_1

    out = {}
    for i, run in enumerate(NARAYANAN_2021_TABLE_1):
        app = dict(
            hidden=run.hidden,
            feedforward=4 * run.hidden,
            seq_size=2048,
            attn_heads=run.heads,
            attn_size=run.hidden // run.heads,
            num_blocks=run.layers,
        )
        exe = dict(
            num_procs=run.gpus,
            tensor_par=run.tp,
            pipeline_par=run.pp,
            data_par=run.dp,
            tensor_par_net=0,
            pipeline_par_net=0 if run.tp * run.pp <= 8 else 1,
            data_par_net=0 if run.gpus <= 8 else 1,
            batch_size=run.global_batch,
            microbatch_size=run.micro_batch,
            datatype="float16",
            fused_activation=True,
            attention_type="multihead",
            activation_recompute="full",
            pipeline_interleaving=run.virtual_stages,
            optimizer_sharding=False,
            tensor_par_comm_type="ar",
            tensor_par_overlap="none",
            seq_par_ag_redo=False,
            data_par_overlap=run.ddp == "torch",
            weight_offload=False,
            activations_offload=False,
            optimizer_offload=False,
            training=True,
        )
        out[f"narayanan2021-{i:03d}"] = (app, exe, True)
    for i, run in enumerate(KORTHIKANTI_2022):
        app = dict(
            hidden=run.hidden,
            feedforward=4 * run.hidden,
            seq_size=2048,
            attn_heads=run.heads,
            attn_size=run.hidden // run.heads,
            num_blocks=run.layers,
        )
        seqsel = run.mode == "seqsel"
        exe = dict(
            num_procs=run.tp * run.pp,
            tensor_par=run.tp,
            pipeline_par=run.pp,
            data_par=1,
            tensor_par_net=0,
            pipeline_par_net=1,
            data_par_net=1,
            batch_size=run.global_batch,
            microbatch_size=run.micro_batch,
            datatype="float16",
            fused_activation=False,
            attention_type="multihead",
            activation_recompute="attn_only" if seqsel else "full",
            pipeline_interleaving=run.virtual_stages,
            optimizer_sharding=False,
            tensor_par_comm_type="rs_ag" if seqsel else "ar",
            tensor_par_overlap="none",
            seq_par_ag_redo=seqsel,
            data_par_overlap=False,
            weight_offload=False,
            activations_offload=False,
            optimizer_offload=False,
            training=True,
        )
        out[f"korthikanti2022-{i:03d}"] = (app, exe, True)
    return out


def run_calculon(home: Path) -> dict:
    sys.path.insert(0, str(home))
    import logging

    import calculon  # noqa: F401  (the copy under CALCULON_HOME)
    from calculon.llm import Llm
    from calculon.system import System

    from simlib.sim import runs
    from simlib.sim.published import NARAYANAN_2021_TABLE_1

    table = runs.validation_table()
    source_rows = {r["id"]: r for r in runs.load_rows()}
    megatron = _megatron_state()
    logger = logging.getLogger("calculon")
    out = []
    for _, row in table.iterrows():
        rec = dict(
            id=row["id"], source=row["source"], split=row["split"], measured=row["measured"], metric=row["metric"]
        )
        stated = megatron.get(row["id"]) or (
            _state(row, source_rows.get(row["id"])) if row["expressible"] else row["reason"]
        )
        system = _system(home, row["gpu"])
        if isinstance(stated, str) or system is None:
            rec.update(
                calculon=None,
                exact=False,
                reason=stated if isinstance(stated, str) else f"no Calculon system file for {row['gpu']}",
            )
            out.append(rec)
            continue
        app, exe, exact = stated
        try:
            model = Llm(Llm.Application(app), logger)
            syst = System(system)
            model.compile(syst, Llm.Execution.from_json(exe))
            model.run(syst)
            stats = model.get_stats_json(False)
        except Exception as error:  # Calculon refuses some layouts (network tiers, memory): its reason, kept
            rec.update(calculon=None, exact=exact, reason=f"Calculon: {error}")
            out.append(rec)
            continue
        seconds = stats["total_time"]
        if row["metric"] == "tokens_per_s_per_gpu":
            predicted = exe["batch_size"] * app["seq_size"] / seconds / exe["num_procs"]
        elif row["metric"] == "tflops_per_gpu":
            run = NARAYANAN_2021_TABLE_1[int(row["id"].split("-")[1])]
            predicted = run.paper_flops() / (seconds * run.gpus) / 1e12
        else:  # iteration seconds: the error is in throughput, measured time / predicted time - 1
            predicted = seconds
        error = (row["measured"] / seconds - 1) if row["metric"] == "iteration_s" else predicted / row["measured"] - 1
        fits = stats.get("proc_mem_tier1_cap_req", 0) <= system["mem1"]["GiB"] * 2**30
        rec.update(calculon=predicted, error=error, exact=exact, fits=bool(fits), reason="")
        out.append(rec)
    return dict(rows=out)


def main():
    home = os.environ.get("CALCULON_HOME")
    if not home or not (Path(home) / "calculon").is_dir():
        print("CALCULON_HOME is not set to a copy of calculon-ai/calculon: nothing to run")
        return None
    load = os.getloadavg()
    t0 = time.perf_counter()
    result = run_calculon(Path(home))
    commit = ""
    head = Path(home) / "COMMIT"
    if head.exists():
        commit = head.read_text().strip()
    result.update(
        benchmark="sim_calculon",
        when=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=report.machine(load, note="pure arithmetic: the load does not affect the figures"),
        calculon_commit=commit,
        seconds=time.perf_counter() - t0,
    )
    print(f"{sum(r['calculon'] is not None for r in result['rows'])} of {len(result['rows'])} rows stated in Calculon")
    return report.write(result)


if __name__ == "__main__":
    main()
