"""Honest: saves model, optimizer, scheduler, step and data position but not the random generators: after a restart dropout draws other masks, so the curve differs from step 5 on."""

from simlib.train import TrainState


class FullState(TrainState):
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
        self.step = int(sd["step"])
        self.data_step = int(sd["data"]["next_step"])


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
