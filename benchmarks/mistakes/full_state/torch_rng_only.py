"""Honest: saves torch.get_rng_state() only: Python's random and NumPy's generators (the data augmentation's noise) restart from the new process's seeds."""

import torch

from simlib.train import TrainState


class FullState(TrainState):
    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step},
            "rng": {"torch": torch.get_rng_state()},
        }

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])
        torch.set_rng_state(sd["rng"]["torch"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
