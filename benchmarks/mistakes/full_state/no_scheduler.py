"""Honest: forgets the scheduler: after a restart the schedule starts again from its warm-up; the first step after the restart still uses the learning rate the optimizer saved, the next ones the restarted schedule's (8 steps, restart at 4: losses differ from step 7)."""

from simlib import checkpoint
from simlib.train import TrainState


class FullState(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
            "rng": checkpoint.rng_state(),
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        checkpoint.set_rng_state(sd["rng"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 8, "save_at": 4}
