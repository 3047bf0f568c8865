"""Where each idea is taught, and who uses it: the table ``tests/test_teaching.py`` checks against the notebooks.

A learner must meet an idea in a lesson before an exercise grades it or the simulator prices it. :data:`TERMS`
names, for every simulator term (a ``sim.Strategy`` field or value) and every idea an exercise grades, the lesson
that teaches it and a phrase of that lesson's prose that shows it is taught there. :data:`EXERCISES` names each
exercise's lesson and the terms its rules use. The test reads the notebooks: every ``Strategy(...)`` keyword any
notebook or solution passes must be a term here, the teaching phrase must be in the teaching lesson's markdown, the
lesson must point to its exercises, and a term must be taught no later than the first lesson or exercise that uses
it, with no exception: the simulator's lessons come after what they price (06, the cost model, after the data,
pipeline and tensor parallelism of 02-05; 09c, the simulator at scale, after the memory of 07 and the context and
experts of 09).
"""

from __future__ import annotations

# term: (lesson that teaches it, a phrase of that lesson's markdown that teaches it)
TERMS = {
    "dp": ("02", "Data parallelism is correct when"),
    "overlap": ("02", "start their first buckets *inside* backward"),
    "micro_batch": ("03", "k micro-batches = one batch"),
    "pp": ("04", "Pipeline parallelism splits the *model*"),
    "num_micro_batches": ("04", "The bubble against the number of micro-batches"),
    "schedule": ("04", "1F1B (PipeDream-Flush) replaced GPipe"),
    "micro-batches in flight": ("04", "GPipe keeps all m micro-batches' activations on every rank"),
    "virtual_stages": ("04", "Interleaved 1F1B"),
    "schedule=interleaved": ("04", "Interleaved 1F1B"),
    "tp": ("05", "Column-parallel, then row-parallel"),
    "pipeline_outer": ("05", "Combine on a rank grid"),
    "sequence_parallel": ("05", "Sequence parallelism: split what tensor parallelism leaves whole"),
    "tp_overlap": ("05", "TP-communication overlap"),
    "first_stage_layers": ("09c", "uneven pipeline stages"),
    "last_stage_layers": ("09c", "uneven pipeline stages"),
    "zero_stage": ("07", "ZeRO shards the optimizer states, then"),
    "16 bytes per parameter": ("07", "**2 + 2 + 12 = 16 bytes**"),
    "optimizer=adam": ("07", "Training with Adam keeps, per parameter"),
    "optimizer=sgd": ("02", "3 SGD steps"),
    "dtype=bf16": ("07", "bf16 keeps fp32's 8 exponent bits"),
    "dtype=fp8": ("07", "FP8: what is scaled"),
    "dtype": ("07", "Mixed precision: loss scaling"),
    "kernels": ("07", "Transformer Engine"),
    "activation memory per layer": ("07", "s·b·h·(34 + 5·a·s/h)"),
    "recompute=full": ("07", "**Full recomputation** keeps only the layer's input"),
    "logits memory": ("07", "the output layer's **fp32 logits**"),
    "recompute=selective": ("07", "**Selective recomputation** drops only the 5·a·s/h term"),
    "FSDP": ("07", "FSDP"),
    "cp": ("09", "Ring attention equals attention over the whole sequence"),
    "cp_kind": ("09", 'all-to-all ("Ulysses") attention'),
    "attention=flash": ("09", "FlashAttention"),
    "ep": ("09", "Expert parallelism splits the *experts*"),
    "moe_experts": ("09", "Expert parallelism splits the *experts*"),
    "moe_top_k": ("09", "top-k experts"),
}

# exercise (file stem in exercises/): (the lesson that teaches it, the terms its rules use)
EXERCISES = {
    "01_ring_all_reduce": ("01", ()),
    "02_average_gradients": ("02", ("dp",)),
    "02_bucket_data_parallel": ("02", ("dp", "overlap")),
    "03_accumulate_no_sync": ("03", ("dp", "micro_batch")),
    "04_one_f_one_b": ("04", ("pp", "schedule", "micro-batches in flight")),
    "04_pipeline_stage": ("04", ("pp", "num_micro_batches")),
    "05_tp_linear": ("05", ("tp",)),
    "05b_online_softmax": ("05b", ()),
    "07_checkpoint_placement": ("07", ("recompute=full",)),
    "07_sharded_optimizer": ("07", ("zero_stage",)),
    "07_zero3_layer": ("07", ("zero_stage",)),
    "08_full_state": ("08", ("dp",)),
    "09_moe_dispatch": ("09", ("ep",)),
    "09_ring_attention": ("09", ("cp",)),
    "09b_zero3_prefetch": ("09b", ("zero_stage",)),
    "11_vision_pieces": ("11", ("dp",)),  # project 2's pieces: SyncBatchNorm (lesson 11 (a)) and the data shard
    "10_gpt_pieces": ("10", ("dp", "overlap", "tp")),  # project 10's pieces (bucketed DP, attention split by heads)
    "12_finance_pieces": ("12", ("dp",)),  # project 3's pieces: per-rank path streams, count-weighted gradients
    "13_plan_memory": (
        "13",
        (
            "16 bytes per parameter",
            "zero_stage",
            "activation memory per layer",
            "logits memory",
            "sequence_parallel",
            "recompute=selective",
            "recompute=full",
            "micro-batches in flight",
            "tp",
            "pp",
            "dp",
        ),
    ),
}

# prose a lesson uses a term by, besides the Strategy keywords the test finds in its code
USED_IN_PROSE = {
    "06": ("dp", "overlap", "pp", "schedule", "virtual_stages", "tp"),
    # 09c's prose and its explorer (dp/tp/pp, micro-batches, ZeRO stage, recomputation, precision)
    "09c": (
        "dtype=fp8",
        "tp_overlap",
        "sequence_parallel",
        "FSDP",
        "zero_stage",
        "recompute=full",
        "recompute=selective",
        "activation memory per layer",
        "16 bytes per parameter",
        "cp",
        "cp_kind",
        "ep",
        "moe_top_k",
        "first_stage_layers",
    ),
}


def order(lesson: str) -> tuple:
    """Sort key of a lesson number: "05" < "05b" < "06"."""
    return int(lesson[:2]), lesson[2:]


def term_of(keyword: str, value=None) -> str:
    """The :data:`TERMS` key of a ``Strategy`` keyword (and its string value where the value is the idea)."""
    key = f"{keyword}={value}" if value is not None else keyword
    return key if key in TERMS else keyword
