"""Wrong training states for lesson 08's exercise (full_state): each leaves one part out of the checkpoint."""
from simlib import checkpoint
from simlib.train import TrainState


class NoOptimizerState(TrainState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "scheduler": self.scheduler.state_dict(), "step": self.step,
                "data": {"next_step": self.data_step}, "rng": checkpoint.rng_state()}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step, self.data_step = sd["step"], sd["data"]["next_step"]
        checkpoint.set_rng_state(sd["rng"])


class NoRngState(TrainState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step, "data": {"next_step": self.data_step}}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step, self.data_step = sd["step"], sd["data"]["next_step"]


class NoDataPosition(TrainState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step, "rng": checkpoint.rng_state()}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.step = sd["step"]
        checkpoint.set_rng_state(sd["rng"])


PLANTED = [NoOptimizerState, NoRngState, NoDataPosition]
HINTS = {"NoOptimizerState": "optimizer state", "NoRngState": "rng state", "NoDataPosition": "data position"}
