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


def floor_division_in_attention(model, s):
    """``5*a*s//h`` for ``5*a*s/h``: the same while the head dim divides the sequence length (64 or 128 and powers
    of two, all the old checks drew), a few tenths of a percent off at head dims 80 and 96 (issue 47)."""
    right = _right(model, s)
    sbh = model.seq_len * s.micro_batch * model.hidden
    exact = sbh * (34 + 5 * model.heads * model.seq_len / model.hidden) / s.tp
    floor = sbh * (34 + 5 * model.heads * model.seq_len // model.hidden) / s.tp
    if s.recompute != "none" or exact == floor:
        return right
    layers_in_flight = right["activations"] - (
        4 * s.micro_batch * model.seq_len * model.vocab / s.tp if s.pp == 1 else 0
    )
    activations = right["activations"] - layers_in_flight + layers_in_flight * floor / exact
    return dict(right, activations=activations, total=right["total"] - right["activations"] + activations)


def vocabulary_padded_to_128(model, s):
    """The logits of a vocabulary padded up to a multiple of 128 (as Megatron pads its embedding): the same while
    every vocabulary drawn was already one (32000, 50304, 51200), not for 50257 or 32001 (issue 47)."""
    right = _right(model, s)
    if s.pp != 1:
        return right
    padded = -(-model.vocab // 128) * 128
    extra = 4 * s.micro_batch * model.seq_len * (padded - model.vocab) / s.tp
    return dict(right, activations=right["activations"] + extra, total=right["total"] + extra)


PLANTED += [floor_division_in_attention, vocabulary_padded_to_128]


def layers_floor_divided(model, s):
    """``L // pp`` layers on a stage: the same while pp divides L, short by a fraction of a layer when not."""
    right = _right(model, s)
    layers = right["activations"] - _right(model, s, in_flight=0)["activations"]  # the layers' set alone
    activations = right["activations"] - layers + layers * (model.layers // s.pp) / (model.layers / s.pp)
    return dict(right, activations=activations, total=right["total"] - right["activations"] + activations)


PLANTED += [layers_floor_divided]
