"""The simulator: a cost model of distributed training, calibrated on this machine, extrapolated to clusters.

hw = sim.calibrate(cluster)                       # or sim.dgx_a100(), sim.dgx_h100(), sim.cpu_box()
model = sim.from_module(MLP(1024, 4))             # or sim.gpt_size("7B")
p = sim.predict(model, hw, sim.Strategy(dp=2, micro_batch=128, dtype="fp32", optimizer="sgd"))
p.step_time, p.compute, p.exposed_comm, p.bubble, p.mfu, p.memory
sim.operator_table(sim.gpt_size("7B"), sim.dgx_a100(), strategy)   # a layer, operator by operator
sim.published.published_table()                                    # Megatron-LM's published runs, predicted
sim.runs.validation_table()            # every published run of four sources (MPT, Llama, Megatron), predicted
sim.plan("70B", "h100", nodes=128, global_batch=1024)   # every valid plan, priced and ranked
sim.llama_size("llama3-8b"); sim.Strategy(..., attention="flash", fsdp=True, zero_stage=3)
sim.Strategy(dp=8, tp=8, pp=16, cp=16, cp_kind="ring")          # context parallelism (allgather, ring, ulysses)
sim.llama_size("qwen3-30b-a3b"); sim.Strategy(dp=8, ep=8)        # experts shared over ep ranks (all-to-all)
sim.preset("gb200")                                              # B200, GB200 NVL72, B300, H100 PCIe/NVL
sim.scale_runs.validation_table()      # published cluster-scale runs (cp, MoE, Blackwell, FP8), predicted
"""

from . import published, runs, scale_runs
from .calibrate import calibrate
from .cost import (
    Prediction,
    all_gather,
    all_reduce,
    hierarchical_all_reduce,
    p2p,
    predict,
    reduce_scatter,
    ring_all_reduce,
    scaling,
    tree_all_reduce,
)
from .hardware import Hardware, Link, fit_alpha_beta
from .hardware_presets import cpu_box, dgx_a100, dgx_h100, dgx_h200, preset
from .layer import Op, layer_ops
from .layer_strategy import operator_table
from .memory import DoesNotFit, check_fits, memory_per_device, min_devices_to_fit
from .model import ModelSpec, from_module
from .model_zoo import GPT_SIZES, LLAMA_SIZES, gpt, gpt_size, llama, llama_size, transformer
from .plan_result import PlanResult
from .planner import plan
from .presets import dgx_b200, dgx_b300, gb200_nvl72
from .replay import replay_data_parallel, replay_pipeline, replay_pipeline_model
from .strategy import Strategy
from .topology import Placement, group_collective, placement

__all__ = [
    "Hardware",
    "Link",
    "calibrate",
    "cpu_box",
    "dgx_a100",
    "dgx_h100",
    "dgx_h200",
    "dgx_b200",
    "gb200_nvl72",
    "dgx_b300",
    "preset",
    "fit_alpha_beta",
    "ModelSpec",
    "from_module",
    "gpt",
    "gpt_size",
    "Strategy",
    "predict",
    "scaling",
    "Prediction",
    "memory_per_device",
    "check_fits",
    "min_devices_to_fit",
    "DoesNotFit",
    "ring_all_reduce",
    "tree_all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "hierarchical_all_reduce",
    "p2p",
    "GPT_SIZES",
    "replay_data_parallel",
    "replay_pipeline",
    "replay_pipeline_model",
    "Op",
    "layer_ops",
    "operator_table",
    "Placement",
    "placement",
    "group_collective",
    "published",
    "runs",
    "scale_runs",
    "transformer",
    "llama",
    "llama_size",
    "LLAMA_SIZES",
    "plan",
    "PlanResult",
]
