"""What a search found (:class:`PlanResult`: the ranked plans, the rejected ones and why, the report, the TOML and
the SLURM script), and how a model or cluster named by the user becomes a ModelSpec or a Hardware. The search
itself is :func:`simlib.sim.planner.plan`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .planner_cost import label
from .planner_trainer import trainer_plan

SEARCHED = (
    "degrees (dp x tp x pp x cp, and ep for an MoE)",
    "context-parallel kind (all-gather, ring, Ulysses)",
    "ZeRO stage 0-3 and FSDP",
    "recomputation",
    "micro-batch size",
    "pipeline schedule and virtual stages",
    "data-parallel overlap",
    "sequence parallelism",
    "tensor-parallel comm overlap",
)
NAMED = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}


def resolve_model(model, seq_len: int | None = None):
    """A :class:`~simlib.sim.ModelSpec` from a spec, ``"8B"``/``"70B"``/``"405B"`` (Llama 3 shapes) or a
    ``LLAMA_SIZES``/``GPT_SIZES`` label; ``seq_len`` overrides the shape's context length."""
    from .model_zoo import GPT_SIZES, LLAMA_SIZES, gpt_size, llama_size

    if not isinstance(model, str):
        return model if seq_len is None else dataclasses.replace(model, seq_len=seq_len)
    label = NAMED.get(model.upper(), model)
    if label in LLAMA_SIZES:
        return llama_size(label, seq_len)
    if label in GPT_SIZES:
        return gpt_size(label, seq_len or 2048)
    raise ValueError(
        f"unknown model {model!r}: use one of {sorted(NAMED)}, {sorted(LLAMA_SIZES)}, "
        f"{sorted(GPT_SIZES)}, or a ModelSpec (sim.llama(...), sim.transformer(...))"
    )


def resolve_hardware(cluster):
    from .hardware import Hardware
    from .hardware_presets import preset

    return cluster if isinstance(cluster, Hardware) else preset(cluster)


@dataclass
class PlanResult:
    """What :func:`plan` found: the ranked plans, the rejected ones and why, and how long the search took."""

    model: object
    hardware: object
    world_size: int
    global_batch: int
    memory_limit: float
    ranked: list  # dicts, fastest first: "strategy", "step_time", "tokens_per_s", "mfu", ...
    too_big: list  # dicts: "strategy", "memory", "excess" (bytes over the limit)
    refused: dict  # validation message -> count
    notes: list
    task: object = None
    seconds: float = 0.0
    considered: int = 0
    exact: bool = False  # every plan priced by sim.predict (the fast path disagreed or was off)
    trainer_only: bool = False
    top: int | None = None  # only the top plans were wanted: ``ranked`` holds those (exactly as a full
    pruned: int = 0  # search ranks them); ``pruned`` combinations were skipped by the bound
    extra: dict = field(default_factory=dict)

    @property
    def best(self) -> dict:
        if not self.ranked:
            raise ValueError(self.nothing_fits())
        return self.ranked[0]

    def trainer(self, entry: dict):
        """The ``simlib.train.Plan`` that runs ``entry`` (None if ``simlib train`` cannot: then
        ``entry["why_not_trainer"]`` says why). Asked when needed: it costs more than pricing."""
        if "plan" not in entry:
            cache = self.extra.setdefault("trainer_cache", {})
            entry["plan"], entry["why_not_trainer"] = trainer_plan(
                entry["strategy"], self.global_batch, self.world_size, self.task, cache
            )
        return entry["plan"]

    @property
    def best_runnable(self) -> dict | None:
        """The fastest plan ``simlib train`` runs as it is (``None`` if none does)."""
        return next((r for r in self.ranked if self.trainer(r) is not None), None)

    @property
    def plans_per_second(self) -> float:
        return self.considered / self.seconds if self.seconds else float("inf")

    def nothing_fits(self) -> str:
        if not self.too_big:
            top = ", ".join(f"{m!r} ({n})" for m, n in sorted(self.refused.items(), key=lambda kv: -kv[1])[:2])
            return f"no valid plan for {self.model.name} on {self.world_size} devices: refused by {top}"
        least = min(self.too_big, key=lambda r: r["excess"])
        return (
            f"no plan of {self.model.name} fits {self.memory_limit / 1e9:.1f} GB per device on "
            f"{self.world_size} devices: the smallest needs {least['memory']['total'] / 1e9:.1f} GB "
            f"({label(least['strategy'])}); use more devices, a larger memory limit or a smaller model"
        )

    def table(self, top: int | None = None):
        """The ranked plans as a pandas DataFrame (one row each, fastest first)."""
        import pandas as pd

        rows = []
        for i, r in enumerate(self.ranked[:top]):
            s = r["strategy"]
            rows.append(
                dict(
                    rank=i + 1,
                    plan=label(s),
                    dp=s.dp,
                    tp=s.tp,
                    pp=s.pp,
                    cp=s.cp,
                    cp_kind=s.cp_kind if s.cp > 1 else "",
                    ep=s.ep,
                    micro_batch=s.micro_batch,
                    micro_batches=s.num_micro_batches,
                    zero=s.zero_stage,
                    fsdp=s.fsdp,
                    recompute=s.recompute,
                    schedule=s.schedule if s.pp > 1 else "",
                    virtual_stages=s.virtual_stages,
                    step_time=r["step_time"],
                    tokens_per_s=r["tokens_per_s"],
                    mfu=r["mfu"],
                    memory_gb=r["memory"]["total"] / 1e9,
                    trainer=self.trainer(r) is not None,
                )
            )
        return pd.DataFrame(rows)

    def report(self, top: int = 3, alternatives: int = 3) -> str:
        from .planner_report import report

        return report(self, top, alternatives)

    def toml(self, entry: dict | None = None, **kw) -> str:
        from .planner_report import toml

        return toml(self, entry, **kw)

    def sbatch(self, config_path: str = "plan.toml", **kw) -> str:
        from .planner_report import sbatch

        return sbatch(self, config_path, **kw)
