"""Wrong implementations planted for the grader's tests: each must be caught by some check.

One module per exercise; every function or class is a classic mistake, named for it.

``PLANTED_IN`` says where each exercise's planted versions are: exercise name -> (module, attribute). The
attribute is a list of the wrong versions, or a dict of them by name. ``tests/test_planted.py`` requires
every exercise (every ``metadata.simlib`` entry of ``solutions/``) to be here with at least three.
"""

PLANTED_IN = {
    "ring_all_reduce": ("ring", "PLANTED"),
    "average_gradients": ("average", "PLANTED"),
    "bucket_data_parallel": ("bucket", "PLANTED"),
    "accumulate_no_sync": ("accumulate", "PLANTED"),
    "one_f_one_b": ("one_f_one_b", "PLANTED"),
    "pipeline_stage": ("pipeline_stage", "PLANTED"),
    "tp_linear": ("tp_linear", "PLANTED"),
    "sharded_optimizer": ("memory", "SHARDED_OPTIMIZER"),
    "zero3_linear": ("memory", "ZERO3_LINEAR"),
    "checkpoint_placement": ("memory", "CHECKPOINT_PLACEMENT"),
    "full_state": ("full_state", "PLANTED"),
    "vision_milestone": ("projects", "VISION"),
    "finance_milestone": ("projects", "FINANCE"),
    "ring_attention": ("context_experts", "RING"),
    "moe_dispatch": ("context_experts", "MOE"),
    "zero3_prefetch": ("prefetch", "PLANTED"),
    "gpt_plan": ("projects", "GPT"),
    "plan_memory": ("planner", "PLANTED"),
    "online_softmax": ("one_device", "PLANTED"),
    "finance_paths": ("finance_pieces", "PATHS"),
    "finance_grad_average": ("finance_pieces", "GRAD_AVERAGE"),
    "finance_pieces_milestone": ("finance_pieces", "MILESTONE"),
    "sync_batchnorm": ("vision_pieces", "SYNC_BATCHNORM"),
    "data_shard": ("vision_pieces", "DATA_SHARD"),
    "gpt_grad_sync": ("gpt_pieces", "GRAD_SYNC"),
    "gpt_tp_attention": ("gpt_pieces", "TP_ATTENTION"),
}
