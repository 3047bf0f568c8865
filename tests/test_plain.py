"""simlib.plain: what a worker that ran someone else's code may send back, and the caller's restricted reading of it
(issue 33, family 1). The last test sends a crafted message from a worker: it is refused, and nothing runs here."""

import collections
import pickle

import numpy as np
import pytest
import torch

from simlib import plain

RAN = []


class _Runs:
    def __reduce__(self):  # what a learner's object does where it is unpickled
        return (RAN.append, ("ran",))


def test_plain_data_round_trips_with_exact_types():
    value = {
        "a": [1, 2.5, (3, "x"), None, True, b"b"],
        "t": torch.nn.Parameter(torch.ones(2, 3).t()),
        "size": torch.Size([2, 3]),
        "np": np.float64(1.5),
        "arr": np.arange(3),
        (1, "k"): torch.float16,
        "ordered": collections.OrderedDict(x=1),
    }
    back = plain.loads(plain.dumps(value, 0), 0)
    assert type(back["t"]) is torch.Tensor and not back["t"].requires_grad and back["t"].is_contiguous()
    assert torch.equal(back["t"], torch.ones(3, 2))
    assert back["size"] == (2, 3) and type(back["size"]) is tuple and type(back["np"]) is float
    assert type(back["ordered"]) is dict and back[(1, "k")] is torch.float16 and back["a"][2] == (3, "x")


@pytest.mark.parametrize(
    "bad, named",
    [
        (type("MyDict", (dict,), {})(a=1), "MyDict"),
        (type("MyStr", (str,), {})("x"), "MyStr"),
        ({"deep": [object()]}, "builtins.object at the result['deep'][0]"),
        (torch.ones(1).as_subclass(type("MyTensor", (torch.Tensor,), {})), "MyTensor"),
        (lambda: 1, "function"),
    ],
)
def test_anything_else_is_refused_naming_the_rank_where_and_the_type(bad, named):
    with pytest.raises(plain.NotPlain, match="rank 3 returned") as info:
        plain.dumps(bad, 3)
    assert named in str(info.value)


def test_the_caller_refuses_bytes_that_would_run_code():
    for data in (pickle.dumps(_Runs()), pickle.dumps({"x": _Runs()}, protocol=2)):
        with pytest.raises(plain.NotPlain, match="rank 1 sent back data the grader refuses"):
            plain.loads(data, 1)
        with pytest.raises(plain.NotPlain):
            plain.pickle_loads(data)
    with pytest.raises(plain.NotPlain):
        plain.frame_loads(pickle.dumps(("out", 0, "stdout", _Runs())))
    ok, failure = plain.read_result(pickle.dumps(_Runs()), 2, True)
    assert not ok and failure.rank == 2 and failure.type_name == "NotPlain"
    assert RAN == []
    assert plain.frame_loads(pickle.dumps(("result", 0, 7, True, b"data"))) == ("result", 0, 7, True, b"data")


def test_exact_str_copies_a_subclass():
    class Sneaky(str):
        def strip(self):
            RAN.append("strip")
            return self

    s = plain.exact_str(Sneaky("dp "))
    assert type(s) is str and s.strip() == "dp" and RAN == []


def _send_a_crafted_message():
    """A learner's code in a worker: finds its connection to the caller and sends an object whose unpickling would
    run code there, then returns normally."""
    import gc

    from simlib.worker import Channel

    chan = next(o for o in gc.get_objects() if type(o) is Channel)
    chan.send(("out", 0, "stdout", _Crafted()))
    return 1


class _Crafted:
    def __reduce__(self):
        return (exec, ("import simlib.plain as p\np.CRAFTED_RAN = True",))


def test_a_crafted_message_from_a_worker_is_refused_and_runs_nothing(cluster2):
    import cloudpickle
    import test_plain

    from simlib.launch import WorkerError

    cloudpickle.register_pickle_by_value(test_plain)
    try:
        with pytest.raises(WorkerError, match="refuses to read"):
            cluster2.call(_send_a_crafted_message, timeout=30)
    finally:
        cloudpickle.unregister_pickle_by_value(test_plain)
    assert not hasattr(plain, "CRAFTED_RAN")
    assert cluster2.call(int, ("5",), plain=True) == [5, 5]  # the cluster restarts and goes on
