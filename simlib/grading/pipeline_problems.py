"""The pipeline exercises' problems (lesson 04: one_f_one_b's real run, pipeline_stage), drawn at check time in the
grader's process with Hypothesis and the OS's randomness: the workers receive only the plain values."""

from __future__ import annotations


def pp_problem():
    """A Hypothesis strategy of the pipeline exercises' problem: 4 to 7 hidden layers (unequal stages on 3 to 5 ranks),
    micro-batches of 1 to 5 samples whose size is not their number (a loss divided by the micro-batch's size
    shows), inputs narrower or wider than the hidden width (a buffer shaped like the input shows), a secret seed."""
    from hypothesis import strategies as st

    return (
        st.fixed_dictionaries(
            dict(
                width=st.integers(4, 12),
                depth=st.integers(4, 7),  # depth + 1 blocks: 5 to 8, enough for 5 stages, unequal on 3, 4 or 5
                in_features=st.integers(2, 9),
                out_features=st.integers(1, 3),
                microbatch=st.integers(1, 5),
                num_microbatches=st.integers(2, 5),
                seed=st.integers(0, 2**62),
            )
        )
        .filter(lambda p: p["microbatch"] != p["num_microbatches"] and p["in_features"] != p["width"])
        .map(lambda p: dict(p, batch=p["microbatch"] * p["num_microbatches"]))
    )


def _pp_draw(extra=None):
    """A problem (and a draw of ``extra``) drawn now from the OS's randomness, again while some layer's gradient is
    all zero (dead ReLUs: a stage that passes on the wrong gradient would pass too); 8 draws at most."""
    from hypothesis import strategies as st

    from .instances import draw

    for _ in range(8):
        got, pp = draw(st.tuples(st.none() if extra is None else extra, pp_problem()), 1)[0]
        if all(bool(g.any()) for g in _pp_reference(pp)[1].values()):
            break
    return (got, pp) if extra is not None else pp


def _pp_size(pp: dict) -> str:
    return (
        f"{pp['depth']} hidden blocks of width {pp['width']}, {pp['num_microbatches']} micro-batches of "
        f"{pp['microbatch']}"
    )


def _pp_problem(pp: dict):
    import torch

    from ..models import MLP, make_regression

    torch.manual_seed(pp["seed"] % 2**63)
    model = MLP(pp["width"], pp["depth"], in_features=pp["in_features"], out_features=pp["out_features"])
    x, y = make_regression(pp["batch"], pp["in_features"], pp["out_features"], seed=pp["seed"] % 2**63)
    return model, x, y


def _pp_reference(pp: dict):
    import torch

    model, x, y = _pp_problem(pp)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}
