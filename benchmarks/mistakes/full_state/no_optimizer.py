"""Honest: forgets the optimizer: AdamW's moments and step count start from zero after a restart, so the first steps after it are different (Adam's bias correction restarts)."""

from simlib import checkpoint
from simlib.train import TrainState


class FullState(TrainState):
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
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        checkpoint.set_rng_state(sd["rng"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
