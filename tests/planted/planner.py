"""Wrong versions of lesson 13's plan_memory: each a classic mistake in the memory of one GPU."""


def _right(model, s, **wrong):
    """The rules of the exercise, with one of them broken by ``wrong``."""
    here = model.params / (s.tp * s.pp)
    shard = wrong.get("shard", lambda stage: s.dp if s.zero_stage >= stage else 1)
    weights = 2 * here / shard(3)
    gradients = 2 * here / shard(2)
    optimizer = 12 * here / shard(1)
    sbh = model.seq_len * s.micro_batch * model.hidden
    tp = wrong.get("act_tp", s.tp)
    whole = sbh * (34 + 5 * model.heads * model.seq_len / model.hidden) / tp
    per_layer = {"none": whole, "selective": sbh * 34 / tp, "full": 2 * sbh / tp}[s.recompute]
    in_flight = wrong.get(
        "in_flight",
        1 if s.pp == 1 else (s.num_micro_batches if s.schedule == "gpipe" else min(s.pp, s.num_micro_batches)),
    )
    activations = per_layer * model.layers / s.pp * in_flight
    if s.recompute == "full" and not wrong.get("no_working_set"):
        activations += whole
    if s.pp == 1 and not wrong.get("no_logits"):
        activations += 4 * s.micro_batch * model.seq_len * model.vocab / s.tp
    return dict(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        total=weights + gradients + optimizer + activations,
    )


def zero1_shards_everything(model, s):
    """ZeRO-1 taken to shard weights and gradients too."""
    return _right(model, s, shard=lambda stage: s.dp if s.zero_stage >= 1 else 1)


def activations_not_split_by_tp(model, s):
    """Activations counted as if every tensor-parallel rank held the whole layer's."""
    return _right(model, s, act_tp=1)


def gpipe_like_1f1b(model, s):
    """Every schedule taken to keep pp micro-batches in flight (GPipe keeps all m)."""
    return _right(model, s, in_flight=1 if s.pp == 1 else min(s.pp, s.num_micro_batches))


def forgets_the_logits(model, s):
    """The fp32 logits of the loss left out when there is no pipeline."""
    return _right(model, s, no_logits=True)


def forgets_the_recompute_working_set(model, s):
    """Full recomputation counted as the layer inputs only."""
    return _right(model, s, no_working_set=True)


PLANTED = [
    zero1_shards_everything,
    activations_not_split_by_tp,
    gpipe_like_1f1b,
    forgets_the_logits,
    forgets_the_recompute_working_set,
]
