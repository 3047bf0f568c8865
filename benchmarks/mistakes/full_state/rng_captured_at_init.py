"""Honest: captures the generators once, in a __post_init__, and saves that copy: TrainState is a dataclass without __post_init__, so its generated __init__ never calls the new one and state_dict fails (AttributeError: no attribute rng); had it run, the copy would be the start of the run's, not the checkpoint's."""

from simlib import checkpoint
from simlib.train import TrainState


class FullState(TrainState):
    def __post_init__(self):
        self.rng = checkpoint.rng_state()

    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
            "rng": self.rng,
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        checkpoint.set_rng_state(sd["rng"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
