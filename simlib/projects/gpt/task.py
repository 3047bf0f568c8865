"""The GPT project as a :class:`simlib.train.Task`: model, text batches, loss, held-out loss, how to split.

task = GPTTask()                 # full size: learns visibly in ~5 min on a 2-core laptop
task = GPTTask.quick()           # a few seconds: tests and SIMLIB_QUICK=1 notebooks
task = GPTTask(seq_len=1024, hidden=768, num_layers=12, num_heads=12,
               corpus="~/.cache/simlib/gpt/tinystories")   # the GPU size (simlib.projects.gpu) on a
                                                           # corpus made by `simlib prepare gpt`
record = simlib.train.train(task, Plan(dp=2), tokens=task.full_tokens, eval_every=50)
"""

from __future__ import annotations

from contextlib import nullcontext as _nothing
from dataclasses import dataclass, field

import torch
from torch import nn

from ... import guards
from . import model as gpt
from . import text


@dataclass
class GPTTask:
    """A GPT on the shipped Shakespeare (byte-level BPE, 1,024 tokens), or on a corpus ``simlib prepare`` made."""

    name: str = "gpt"
    seq_len: int = 64
    hidden: int = 128
    num_layers: int = 4
    num_heads: int = 4
    global_batch: int = 32  # windows of seq_len tokens per optimizer step, over all ranks
    eval_windows: int = 64  # held-out windows the eval loss averages over
    seed: int = 0
    moe_experts: int = 0  # the MoE variant: E experts in every block's MLP (0: dense)
    moe_top_k: int = 1  # experts per token
    moe_capacity_factor: float = 1.25  # room per expert: ceil(factor · tokens · k / E) tokens of a step
    moe_aux_coeff: float = 0.01  # weight of the load-balancing loss
    corpus: str = ""  # "" the shipped Shakespeare; else a folder made by `simlib prepare gpt`
    compile: bool = False  # torch.compile each block (falls back to eager, saying why, if it fails)
    data: text.TextData = field(init=False, repr=False)

    def __post_init__(self):
        guards.check_task(self)  # every field, one line naming a wrong one
        if self.corpus:
            self.corpus = str(text.resolve_folder(self.corpus))
        self.data = text.TextData(self.seq_len, self.seed, self.eval_windows, self.corpus)
        guards.check_held_out(self)  # seq_len leaves at least one held-out window

    @classmethod
    def quick(cls, **overrides) -> GPTTask:
        """A model small enough for tests: 2 layers, hidden 64, context 32."""
        sizes = dict(seq_len=32, hidden=64, num_layers=2, num_heads=4, global_batch=16, eval_windows=16)
        return cls(**{**sizes, **overrides})

    @property
    def config(self) -> gpt.GPTConfig:
        return gpt.GPTConfig(
            self.data.vocab_size,
            self.seq_len,
            self.hidden,
            self.num_layers,
            self.num_heads,
            seed=self.seed,
            moe_experts=self.moe_experts,
            moe_top_k=self.moe_top_k,
            moe_capacity_factor=self.moe_capacity_factor,
            moe_aux_coeff=self.moe_aux_coeff,
        )

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def flops_per_sample(self) -> float:
        return self.config.flops_per_token() * self.seq_len

    # ── the Task protocol ──
    def build_model(self) -> gpt.GPT:
        model = gpt.GPT(self.config)
        if self.compile:
            gpt.compile_blocks(model)
        return model

    def batch(self, step: int, part: int = 0, parts: int = 1):
        return self.data.batch(step, self.global_batch, part, parts)

    def loss(self, logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def evaluate(self, model) -> dict:
        """Mean next-token cross-entropy (nats) over the held-out windows."""
        device = next(model.parameters()).device
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in self.data.eval_batches():
                total += float(self.loss(model(x.to(device)), y.to(device))) * y.numel()
                count += y.numel()
        return {"eval_loss": total / count}

    # ── how it splits ──
    def tensor_parallel(self, model, tp_group, log=None, sequence_parallel: bool = False):
        return gpt.tensor_parallel(model, tp_group, log, sequence_parallel)

    def unsplit_state(self, pm) -> dict:
        """The whole model's weights from a run's :class:`simlib.parallelize.ParallelModel` (a collective under TP
        and PP: every rank calls it), as CPU tensors: what a grader loads into a freshly built GPT."""
        plan, groups = pm.plan, pm.groups
        model = pm.eval_model()
        state = gpt.dense_state_dict(
            model, groups.tp_group if plan.tp > 1 else None, groups.ep_group if plan.ep > 1 else None
        )
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def pipeline_stages(self, model, pp_rank: int, pp_size: int):
        return gpt.pipeline_stages(model, pp_rank, pp_size)

    def context_parallel(self, model, split):
        return gpt.context_parallel(model, split)

    def tied_parameters(self, model):
        return [model.embed.wte.weight]

    def blocks(self, model):
        return list(model.blocks)

    def check_plan(self, plan) -> None:
        if self.num_heads % plan.tp:
            ok = [t for t in range(1, self.num_heads + 1) if self.num_heads % t == 0]
            raise ValueError(
                f"tp={plan.tp} does not divide the model's {self.num_heads} attention heads: use tp in {ok}"
            )
        if plan.pp > self.num_layers:
            raise ValueError(
                f"pp={plan.pp} stages but the model has {self.num_layers} blocks: use pp <= {self.num_layers}"
            )
        ep = plan.ep  # seq_len against cp, and ep without experts: Plan.validate (parallel.dims)
        if ep > 1 and self.moe_experts % ep:
            ok = [e for e in range(1, self.moe_experts + 1) if self.moe_experts % e == 0]
            raise ValueError(f"ep={ep} does not divide the {self.moe_experts} experts: use ep in {ok}")
        if self.moe_experts and (plan.tp > 1 or plan.pp > 1):
            raise ValueError(
                f"the MoE variant (moe_experts={self.moe_experts}) runs with dp, cp and ep, not with "
                f"tp={plan.tp} / pp={plan.pp}: use e.g. Plan(dp={plan.world_size}, ep=2)"
            )
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(f"moe_top_k={self.moe_top_k} must be between 1 and moe_experts={self.moe_experts}")

    # ── for people ──
    def sample(self, model, prompt: str = "The ", new_tokens: int = 60, seed: int = 0, **kw) -> str:
        device = next(model.parameters()).device
        idx = text.encode(prompt, self.data.tokenizer).unsqueeze(0).to(device)
        was = model.training
        model.eval()
        # compiled blocks run eagerly here: every new length would be another compile (a minute at the GPU size)
        stance = getattr(torch.compiler, "set_stance", None)
        with stance("force_eager") if stance and self.compile else _nothing():
            out = gpt.GPT.generate(model, idx, new_tokens, seed=seed, **kw)
        model.train(was)
        return text.decode(out[0], self.data.tokenizer)
