"""A small GPT, in one file: token + position embedding, pre-LayerNorm blocks, causal attention, MLP, tied head.

GPT-2's layout (Radford et al. 2019), as in nanoGPT; no dropout, so every plan computes the same function.
Shapes: B batch, T sequence, H hidden, V vocabulary, nh heads.

    model = GPT(GPTConfig(vocab_size=1024, seq_len=64, hidden=128, num_layers=4, num_heads=4))
    logits = model(idx)                       # (B, T) token ids -> (B, T, V)

How the project splits it (``simlib.parallelize`` calls these through ``simlib.projects.gpt.GPTTask``):

    tensor_parallel(model, group)     attention by heads and the MLP by columns (``simlib.parallel.tensor``,
                                      Megatron's f and g): two all-reduces of (B, T, H) per block in forward,
                                      two in backward; embeddings, LayerNorms and the tied head are replicated
    tensor_parallel(model, group, sequence_parallel=True)
                                      the same, and between the TP regions each rank keeps S/t of the sequence:
                                      the embedding looks up its block, LayerNorms and residuals run on it, each
                                      region all-gathers / reduce-scatters it, the logits are all-gathered; the
                                      replicated weights' gradients are summed over the group after the backward
    pipeline_stages(model, r, p)      stage r of p: contiguous blocks, the embedding on the first stage, the
                                      final LayerNorm and the head on the last; the tied embedding matrix is on
                                      both, and its two gradients are summed after the pipeline flush (Megatron's
                                      "embedding group")
    context_parallel(model, split)    every attention becomes ring attention over ``split``'s group and the
                                      embedding takes the global positions of this rank's zig-zag slice, while
                                      the split is on (``simlib.parallel.context``)

The MoE variant (``GPTConfig(moe_experts=4, moe_top_k=2)``): every block's MLP is a top-k routed mixture of
experts (``simlib.parallel.experts.MoEFeedForward``), whose experts ``simlib.parallelize`` shares out over the
expert-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...models import TransformerBlock


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 1024
    seq_len: int = 64  # context length T
    hidden: int = 128  # H
    num_layers: int = 4
    num_heads: int = 4  # nh; head size H / nh
    ffn: int | None = None  # MLP width (default 4 H); each expert's width in the MoE variant
    seed: int = 0  # initial weights: the same on every rank
    moe_experts: int = 0  # 0: dense MLPs; E > 0: every MLP a mixture of E experts (the MoE variant)
    moe_top_k: int = 1  # experts per token
    moe_capacity_factor: float = 1.25  # tokens an expert takes: ceil(factor · tokens · k / E); the rest dropped
    moe_aux_coeff: float = 0.01  # weight of the Switch load-balancing loss (Fedus et al. 2021)

    def num_parameters(self, active: bool = False) -> int:
        """Parameters of the model (``active``: those one token uses: k experts of E, and the router)."""
        h, f = self.hidden, self.ffn or 4 * self.hidden
        mlp = (h * f + f) + (f * h + h)
        if self.moe_experts:
            mlp = (min(self.moe_top_k, self.moe_experts) if active else self.moe_experts) * mlp + h * self.moe_experts
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + mlp
        return self.vocab_size * h + self.seq_len * h + self.num_layers * block + 2 * h

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per weight used (forward 2, backward 4) plus attention's scores and
        mixing, 12·L·T·H, halved by the causal mask (Kaplan et al. 2020 count it the same way)."""
        weights = self.num_parameters(active=True) - self.seq_len * self.hidden  # the position table is a lookup
        return 6 * weights + 6 * self.num_layers * self.seq_len * self.hidden


def compile_blocks(model: GPT, backend="inductor") -> None:
    """``torch.compile`` each block in place (``nn.Module.compile``: the parameters and state_dict keys stay as
    they are, so TP, PP, recomputation and checkpoints see the same model; torchtitan compiles per block too).
    Compilation happens at the first forward; if it fails there, :func:`uncompile_blocks` runs the model eagerly
    and says why. The backward graph is lowered at that same forward (not lazily at the first backward), so a
    compiler failure shows up where it can be caught."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        functorch_config.force_non_lazy_backward_lowering = True
    for block in model.blocks:
        block.compile(backend=backend)


def uncompile_blocks(model: GPT, exc: BaseException) -> bool:
    """After ``exc`` in a compiled forward: back to eager blocks (same numbers, slower), one line on stderr naming
    the rank and the cause; False when no block was compiled (the error is the model's own)."""
    import sys

    compiled = [b for b in model.blocks if getattr(b, "_compiled_call_impl", None) is not None]
    if not compiled:
        return False
    for block in compiled:
        block._compiled_call_impl = None
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc  # the compiler's own error
    cause = (str(inner).strip().splitlines() or [""])[0][:300]
    print(
        f"[rank{rank}] torch.compile failed ({type(inner).__name__}: {cause}); the GPT runs eagerly instead (same "
        "results, slower). Usual causes: no C++ compiler, or no Triton for this GPU (compute capability < 7.0); "
        "--task.compile false silences this",
        file=sys.stderr,
        flush=True,
    )
    return True


class Block(TransformerBlock):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x)). (B, T, H) -> (B, T, H)."""

    def __init__(self, cfg: GPTConfig):
        make_mlp = None
        if cfg.moe_experts:  # router, E x (fc1, GELU, fc2)
            from ...parallel.experts import MoEFeedForward

            def make_mlp():
                return MoEFeedForward(
                    cfg.hidden, cfg.moe_experts, cfg.moe_top_k, cfg.moe_capacity_factor, cfg.ffn, cfg.moe_aux_coeff
                )

        super().__init__(cfg.hidden, cfg.num_heads, cfg.ffn, make_mlp)


class Embedding(nn.Module):
    """Token plus learned position embedding: (B, T) ids -> (B, T, H)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.split = None  # context parallelism: a simlib.parallel.context.ContextSplit
        self.sp_group = None  # sequence parallelism: look up this rank's block of the sequence only

    def forward(self, idx):
        if self.split is not None and self.split.active:  # this rank's slice of each sequence
            positions = self.split.positions(idx.shape[1], idx.device)
        elif self.sp_group is not None:
            from ...parallel.tensor import sequence_slice

            block = sequence_slice(idx.shape[1], self.sp_group)
            idx, positions = idx[:, block], torch.arange(block.start, block.stop, device=idx.device)
        else:
            positions = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(positions)  # (B, T, H) + (T, H)


class Head(nn.Module):
    """Final LayerNorm and the output layer tied to the token embedding: (B, T, H) -> (B, T, V)."""

    def __init__(self, cfg: GPTConfig, wte: nn.Embedding):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.wte = [wte]  # a plain list: the tied matrix is registered once, in the embedding
        self.sp = None  # sequence parallelism: (group, log) to all-gather the logits of the blocks

    def forward(self, x):
        logits = self.ln_f(x) @ self.wte[0].weight.T  # (B, T, H) @ (H, V)
        if self.sp is not None:
            from ...parallel.tensor import GatherSequenceReplicated

            logits = GatherSequenceReplicated.apply(logits, *self.sp)  # (B, T / t, V) -> (B, T, V)
        return logits


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg, self.embed.wte)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 L)
            mlps = block.mlp.moe.experts if cfg.moe_experts else [block.mlp]
            for proj in (block.attn.out, *(mlp.fc2 for mlp in mlps)):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.num_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:  # the MoE router has none
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):  # (B, T) token ids
        x = self.embed(idx)  # (B, T, H)
        try:
            h = x
            for block in self.blocks:
                h = block(h)  # (B, T, H)
        except Exception as exc:  # noqa: BLE001 - only a compiled model retries, eagerly
            if not uncompile_blocks(self, exc):
                raise
            h = x
            for block in self.blocks:
                h = block(h)
        return self.head(h)  # (B, T, V) logits

    @torch.no_grad()
    def generate(self, idx, new_tokens: int, temperature: float = 0.8, top_k: int | None = 40, seed: int = 0):
        """Sample ``new_tokens`` tokens after ``idx`` (B, T0); the context is cut to the last ``seq_len``."""
        g = torch.Generator(device=idx.device).manual_seed(seed)
        for _ in range(new_tokens):
            logits = self(idx[:, -self.cfg.seq_len :])[:, -1, :] / temperature  # (B, V)
            if top_k:
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# ── how the model splits ─────────────────────────────────────────────────────────────────────────────────
def tensor_parallel(model: GPT, group, log=None, sequence_parallel: bool = False) -> GPT:
    """Split every block's attention (by heads) and MLP (by columns) over ``group``, in place.

    ``sequence_parallel``: outside the split layers each rank holds its block of the sequence (the gradients of
    the replicated weights are then partial: ``simlib.parallelize`` sums them over ``group``)."""
    from ... import pieces
    from ...parallel.learner_pieces import learner_tp_attention
    from ...parallel.tensor import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, tensor_parallel_attention

    learner = pieces.get("tp_attention")  # the project's slot: the learner's attention split by heads, if given
    for block in model.blocks:
        if learner is not None:
            block.attn = learner_tp_attention(learner, block.attn, group, log, sequence_parallel)
        else:
            block.attn = tensor_parallel_attention(block.attn, group, log)
        block.mlp = TensorParallelMLP.from_dense(block.mlp, group, log)
    if sequence_parallel:
        model.embed.sp_group, model.head.sp = group, (group, log)
        for m in model.blocks.modules():
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
                m.sequence_parallel = True
    return model


def context_parallel(model: GPT, split) -> GPT:
    """Attention as ring attention over ``split.group`` and the embedding at this rank's global positions,
    while ``split`` is on (``simlib.parallel.context.ContextSplit``); in place, the same parameters."""
    from ...parallel.context import ContextParallelAttention

    model.embed.split = split
    for block in model.blocks:
        block.attn = ContextParallelAttention(block.attn, split)
    return model


class Stage(nn.Module):
    """Pipeline stage: [embedding] -> blocks -> [head]. The first takes ids, the last returns logits."""

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)
        self.wte = model.embed.wte if last and not first else None  # the tied matrix, held here too
        self.head = model.head if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def pipeline_stages(model: GPT, pp_rank: int, pp_size: int) -> list[nn.Module]:
    """This rank's stage (modules shared with ``model``, not copies)."""
    from ...parallel.pipeline import split_blocks

    ranges = split_blocks(len(model.blocks), pp_size)
    return [Stage(model, ranges[pp_rank], first=pp_rank == 0, last=pp_rank == pp_size - 1)]


def dense_state_dict(model: GPT, tp_group=None, ep_group=None) -> dict:
    """The unsplit model's weights from a tensor-parallel one (a collective over ``tp_group``), or a copy;
    under expert parallelism, every expert gathered from the ranks of ``ep_group`` (a collective too).

    Column-parallel weights are gathered along their output rows (qkv's rows are laid out (3, heads, head
    size), so each of q, k, v is put back head by head); row-parallel weights along their input columns.
    """
    import torch.distributed as dist

    from ...parallel.tensor import TensorParallelMLP

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if ep_group is not None and dist.get_world_size(ep_group) > 1:
        state = _gather_experts(model, state, ep_group)
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return state
    tp = dist.get_world_size(tp_group)

    def gather(t, dim):
        parts = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(parts, t.contiguous(), group=tp_group)
        return torch.cat(parts, dim)

    for i, block in enumerate(model.blocks):
        if not isinstance(block.mlp, TensorParallelMLP):  # a split block (its attention the course's or a learner's)
            continue
        p = f"blocks.{i}."
        for suffix in ("weight", "bias"):
            local = state[p + "attn.qkv." + suffix]  # (3 * lh * hd[, H])
            parts = gather(local.unsqueeze(0), 0)  # (tp, 3 * lh * hd[, H])
            parts = parts.view(tp, 3, -1, *local.shape[1:])  # (tp, 3, lh * hd[, H])
            state[p + "attn.qkv." + suffix] = parts.transpose(0, 1).reshape(-1, *local.shape[1:])
            state[p + "mlp.fc1." + suffix] = gather(state[p + "mlp.fc1." + suffix], 0)
        state[p + "attn.out.weight"] = gather(state[p + "attn.out.weight"], 1)
        state[p + "mlp.fc2.weight"] = gather(state[p + "mlp.fc2.weight"], 1)
    return state


def _gather_experts(model: GPT, state: dict, ep_group) -> dict:
    """Local expert j of EP rank r is expert r·E/ep + j of the model: gather every expert under its own name."""
    import torch.distributed as dist

    ep = dist.get_world_size(ep_group)
    for i, block in enumerate(model.blocks):
        local = len(block.mlp.moe.experts)
        prefix = f"blocks.{i}.mlp.moe.experts."
        names = [k for k in state if k.startswith(prefix)]
        for name in names:
            j, rest = name[len(prefix) :].split(".", 1)
            parts = [torch.empty_like(state[name]) for _ in range(ep)]
            dist.all_gather(parts, state[name].contiguous(), group=ep_group)
            del state[name]
            for r, part in enumerate(parts):
                state[f"{prefix}{r * local + int(j)}.{rest}"] = part
    return state
