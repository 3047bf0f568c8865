# exercise: full_state
# kind: honest
# mistake: restores the data position as step + 1 (thinking the checkpoint is taken before the step's batch is drawn): the restarted run skips a batch.
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
        checkpoint.set_rng_state(sd["rng"])
        self.data_step = self.step + 1


ANSWER = FullState
