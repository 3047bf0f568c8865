"""Wrong training states for lesson 08's exercise (full_state): each leaves one part out of the checkpoint."""

from simlib import checkpoint
from simlib.train import TrainState


class NoOptimizerState(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
            "rng": checkpoint.rng_state(),
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step, self.data_step = sd["step"], sd["data"]["next_step"]
        checkpoint.set_rng_state(sd["rng"])


class NoRngState(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step, self.data_step = sd["step"], sd["data"]["next_step"]


class NoDataPosition(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "rng": checkpoint.rng_state(),
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = sd["step"]
        checkpoint.set_rng_state(sd["rng"])


class InheritsEverything(TrainState):
    """The base class already saves everything: nothing written (issue 19)."""


class DelegatesToLibrary(TrainState):
    """Hands the work back to the library's TrainState."""

    def state_dict(self):
        return super().state_dict()

    def load_state_dict(self, sd):
        super().load_state_dict(sd)


def _full(self):
    return {
        "model": self.model.state_dict(),
        "optimizer": self.optimizer.state_dict(),
        "scheduler": self.scheduler.state_dict(),
        "step": self.step,
        "data": {"next_step": self.data_step},
    }


def _load(self, sd):
    self.model.load_state_dict(sd["model"])
    self.optimizer.load_state_dict(sd["optimizer"])
    self.scheduler.load_state_dict(sd["scheduler"])
    self.step, self.data_step = int(sd["step"]), int(sd["data"]["next_step"])


class OneRngForAll(TrainState):
    """Restores every rank's generators from rank 0's: right only when every rank draws the same numbers."""

    def state_dict(self):
        return {**_full(self), "rng": checkpoint.rng_state()}

    def load_state_dict(self, sd):
        import torch
        import torch.distributed as dist

        _load(self, sd)
        checkpoint.set_rng_state(sd["rng"])
        state = torch.get_rng_state()
        dist.broadcast(state, src=0)
        torch.set_rng_state(state)


class RngUnderAnotherKey(TrainState):
    """Saves the generators under "generators": not one per rank (simlib keeps one per rank under "rng" only),
    so the checkpoint holds one rank's generators, restored on every rank."""

    def state_dict(self):
        return {**_full(self), "generators": checkpoint.rng_state()}

    def load_state_dict(self, sd):
        _load(self, sd)
        checkpoint.set_rng_state(sd["generators"])


class _Complete(TrainState):
    """A right state (what the solution saves), for the planted versions below to misuse."""

    def state_dict(self):
        return {**_full(self), "rng": checkpoint.rng_state()}

    def load_state_dict(self, sd):
        _load(self, sd)
        checkpoint.set_rng_state(sd["rng"])


_LIBRARY = (TrainState.state_dict, TrainState.load_state_dict)  # kept when the cell runs, before any check


class SwapsInTheLibrary(TrainState):
    """Issue 33: writes both methods (the class passes a look at its attributes), then swaps the library's own,
    kept in a variable beforehand, onto every instance."""

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass

    def __init__(self, *args, **kwargs):
        import types

        super().__init__(*args, **kwargs)
        self.state_dict = types.MethodType(_LIBRARY[0], self)
        self.load_state_dict = types.MethodType(_LIBRARY[1], self)


class SleepsAfterRestart(_Complete):
    """Issue 33: right in every way, but stalls for 240 s in a worker the elastic agent restarted."""

    def load_state_dict(self, sd):
        import os
        import time

        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            time.sleep(240)
        super().load_state_dict(sd)


PLANTED = [
    NoOptimizerState,
    NoRngState,
    NoDataPosition,
    InheritsEverything,
    DelegatesToLibrary,
    OneRngForAll,
    RngUnderAnotherKey,
    SwapsInTheLibrary,
]
HINTS = {
    "NoOptimizerState": "optimizer state",
    "NoRngState": "rng state",
    "NoDataPosition": "data position",
    "InheritsEverything": "not done yet",
    "DelegatesToLibrary": "switched off in this exercise",
    "OneRngForAll": "first different",
    "RngUnderAnotherKey": "every rank's rng state",
    "SwapsInTheLibrary": "switched off in this exercise",
}
STATUS = {"InheritsEverything": "not implemented", "DelegatesToLibrary": "error", "SwapsInTheLibrary": "error"}
