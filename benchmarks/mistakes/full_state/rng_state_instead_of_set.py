"""Honest: calls checkpoint.rng_state() in load_state_dict (reads the generators) where set_rng_state(sd['rng']) restores them: the loaded generators are ignored."""

from simlib import checkpoint
from simlib.train import TrainState


class FullState(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
            "rng": checkpoint.rng_state(),
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        checkpoint.rng_state()


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
