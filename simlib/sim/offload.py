"""Activation offloading to host memory (Megatron-Core's ``cpu_offloading``, ``--cpu-offloading-num-layers``).

Megatron-Core hands the layers' saved tensors to Transformer Engine's CPU-offload context
(``megatron/core/transformer/transformer_block.py`` → ``transformer_engine/pytorch/cpu_offload.py``, TE v2.9,
``AsyncDoubleBufferGroupOffloadHandler``): ``n`` of a stage's ``L`` layers have their activations copied to pinned
host memory on a side stream after their forward and copied back, one window ahead, in backward. The copies are
spread over the stage (``layer_window_map``: offload group ``i`` must be done by layer ``(L // n)·(i + 1) − 1``),
so each copy runs beside ``L // n`` layers of compute and stalls the compute stream only by what it takes longer
(TE: "completely hidden behind computation if computation time of a layer is longer than host-device communication
time"). What stays on the device is the other ``L − n`` layers' activations.

Megatron-Bridge's performance recipes turn it on for Llama 3 70B under Megatron-FSDP on GB200/GB300 and B200
(``scripts/performance/configs/llama*/…workload_base_configs.py``: ``cpu_offloading_num_layers`` 20–40;
``utils/overrides.py`` sets ``cpu_offloading=True``, ``cpu_offloading_weights=False``), so these runs fit in memory
where the simulator without it says they cannot.
"""

from __future__ import annotations


def offload_exposed(
    strategy, hardware, layers_here: int, layer_bytes: float, layer_forward: float, layer_backward: float
) -> float:
    """Seconds per micro-batch that the offload copies add to a stage: for each of the ``n`` offloaded layers,
    the device-to-host copy of ``layer_bytes`` beyond ``L // n`` layers' forward, and the host-to-device copy
    beyond as many layers' backward (``hardware.host_link`` bytes/s each way)."""
    n = strategy.offloaded(layers_here)
    if not n:
        return 0.0
    if not hardware.host_link:
        raise ValueError(f"activation offloading needs the host link's bandwidth: {hardware.name} states none")
    copy = layer_bytes / hardware.host_link
    window = int(layers_here) // n
    return n * (max(0.0, copy - window * layer_forward) + max(0.0, copy - window * layer_backward))


def offload_time(model, hardware, strategy, stage: dict) -> float:
    """:func:`offload_exposed` for one micro-batch of a GPT on its most loaded pipeline rank (``stage``: what
    :func:`simlib.sim.cost.gpt_stage` returns), the layer's activation bytes as :mod:`simlib.sim.memory` counts
    them (its sequence share under cp)."""
    from dataclasses import replace

    from .memory import activation_bytes_per_layer, kept_value_bytes, saved_by

    s = strategy
    if not s.offload_layers or model.kind != "gpt":
        return 0.0
    seq_model = replace(model, seq_len=model.seq_len // s.cp) if s.cp > 1 else model
    layer_bytes = activation_bytes_per_layer(
        seq_model,
        s.micro_batch,
        s.tp,
        s.recompute,
        s.sequence_parallel,
        s.attention,
        kept_value_bytes(s),
        **saved_by(s),  # as memory keeps it
        recompute_modules=tuple(getattr(s, "recompute_modules", ())),
    )
    layers_here = max(s.stage_layers(model.layers)) if s.virtual_stages == 1 or s.stage_layout else model.layers // s.pp
    return offload_exposed(s, hardware, layers_here, layer_bytes, stage["layer_forward"], stage["layer_backward"])
