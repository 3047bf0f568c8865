"""Honest: saves what the torch.save(model.state_dict()) tutorials save, the weights (and the step for the folder name): the optimizer's moments, the schedule, the data position and the generators restart."""

from simlib.train import TrainState


class FullState(TrainState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "step": self.step}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.step = int(sd["step"])
        self.data_step = self.step


ANSWER = FullState
KIND = "honest"
PROVE = {"world_size": 2, "steps": 6, "save_at": 4}
