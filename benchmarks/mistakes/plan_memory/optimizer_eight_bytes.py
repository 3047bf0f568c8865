"""Honest: counts Adam's state as 8 bytes per parameter (momentum and variance) and forgets the fp32 master weights that mixed precision keeps (4 more bytes)."""


def plan_memory(model, strategy):
    s = strategy
    here = model.params / (s.tp * s.pp)
    weights = 2 * here / (s.dp if s.zero_stage >= 3 else 1)
    gradients = 2 * here / (s.dp if s.zero_stage >= 2 else 1)
    optimizer = 8 * here / (s.dp if s.zero_stage >= 1 else 1)
    sbh = model.seq_len * s.micro_batch * model.hidden
    whole = sbh * (34 + 5 * model.heads * model.seq_len / model.hidden) / s.tp
    per_layer = {"none": whole, "selective": sbh * 34 / s.tp, "full": 2 * sbh / s.tp}[s.recompute]
    in_flight = 1 if s.pp == 1 else (s.num_micro_batches if s.schedule == "gpipe" else min(s.pp, s.num_micro_batches))
    activations = per_layer * model.layers / s.pp * in_flight
    if s.recompute == "full":
        activations += whole
    if s.pp == 1:
        activations += 4 * s.micro_batch * model.seq_len * model.vocab / s.tp
    return dict(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        total=weights + gradients + optimizer + activations,
    )


ANSWER = plan_memory
KIND = "honest"
PROVE = {
    "model": [24, 2048, 16],
    "model_kw": {"seq_len": 2048, "vocab": 51200},
    "strategy": {"dp": 8, "tp": 2, "pp": 1, "micro_batch": 2, "num_micro_batches": 8, "sequence_parallel": True},
}
