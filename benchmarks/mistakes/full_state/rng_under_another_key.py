"""Honest: puts the generators under the key 'random' instead of 'rng': the checkpoint keeps one copy (rank 0's) for keys other than 'rng', so every rank restarts with rank 0's generators."""

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
            "random": checkpoint.rng_state(),
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        checkpoint.set_rng_state(sd["random"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
