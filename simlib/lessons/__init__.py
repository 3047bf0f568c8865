"""The lessons' runners: one module per lesson, each a demonstration that calls the building blocks.

The building blocks (what ``simlib.parallelize`` composes) live in ``simlib.parallel``; the one training loop is
``simlib.train``. A module here sets up a lesson's experiment (sizes, timings, a reference to compare with) and
returns rows a notebook prints or plots; it never holds a second copy of a technique.

    scaling        lessons 00 and 02: the scaling sweep behind ``simlib scaling`` (DP through the one loop)
    data_parallel  lesson 02: each DP wrapper against the one-process reference; DDP's all-reduces counted
    accumulation   lesson 03: micro-batches with and without ``no_sync``, the missing 1/k
    pipeline       lesson 04: pipeline schedules run for real, against ``torch.distributed.pipelining``
    tensor         lesson 05: Megatron tensor parallelism against the unsplit layer and DTensor
    memory         lesson 07: DDP, ZeRO-1/2/3 and FSDP2 side by side: peak bytes, step time, bytes moved
    fault_tolerance  lesson 08: what a checkpoint holds per parameter
    context_experts  lesson 09: ring/Ulysses attention and MoE runs; the two causal imbalances
    evidence       every lesson that times: verdicts only beyond the spread and never on a busy machine, speedups
                   the right way up, the quiet reference run a benchmark committed
    syllabus       where each idea and simulator term is taught, and who uses it (tests/test_teaching.py)
"""
