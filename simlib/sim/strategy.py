"""How a job is split: data, tensor and pipeline degrees, micro-batches, ZeRO, buckets, overlap, recomputation.

The rank grid is ``arange(world_size).view(dp, pp, tp)`` (tensor-parallel ranks adjacent, so they share a
node, as in Megatron-LM and picotron); :class:`Strategy` validates the degrees instead of keeping globals, and
against a machine: a tensor-parallel group must sit inside one node (tp divides the node's devices) unless
``tp_across_nodes=True`` asks for it (then it is priced on the inter-node link). ``simlib.sim.topology`` places
every group of the grid on the nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..parallel import dims

RECOMPUTE = ("none", "selective", "op", "every_other", "full")
ATTENTION = ("unfused", "flash", "flash1")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
OPTIMIZERS = ("adam", "sgd", "sgd_momentum")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Strategy:
    dp: int = 1                      # data-parallel degree (replicas)
    tp: int = 1                      # tensor-parallel degree (Megatron column/row splits)
    pp: int = 1                      # pipeline-parallel degree (stages)
    micro_batch: int = 1             # samples per micro-batch on one data-parallel rank
    num_micro_batches: int = 1       # accumulation steps (pp = 1) or pipeline micro-batches per step
    zero_stage: int = 0              # 0: replicate; 1: shard optimizer states; 2: + gradients; 3: + weights
    bucket_bytes: float = 25e6       # gradient bucket (PyTorch DDP's default is 25 MB)
    overlap: bool = False            # all-reduce buckets while backward still runs
    recompute: str = "none"          # activation recomputation: none | selective | op | every_other | full
    attention: str = "unfused"       # "flash": one fused kernel (FlashAttention-2), no s×s scores in memory;
                                     # "flash1": FlashAttention-1 / the Triton kernel (slower)
    schedule: str = "1f1b"           # pipeline schedule: 1f1b | gpipe | interleaved
    virtual_stages: int = 1          # model chunks per pipeline rank (interleaved 1F1B)
    sequence_parallel: bool = False  # with tp > 1: shard layer norms/dropout along the sequence (Korthikanti)
    tp_across_nodes: bool = False    # allow a tensor-parallel group to span nodes (priced on the inter-node link)
    dtype: str = "bf16"              # compute dtype; bf16/fp16 mean mixed precision with fp32 master weights
    optimizer: str = "adam"
    threads: int | None = None       # CPU only: torch threads per process (None: cores // processes)
    fsdp: bool = False               # shard as PyTorch FSDP does: zero_stage 3 = FULL_SHARD, 2 = SHARD_GRAD_OP;
                                     # per layer all-gather / reduce-scatter every micro-batch, prefetched
    shard_size: int = 0              # FSDP hybrid sharding: shard over groups of this many ranks, replicate
                                     # across them (0: shard over all dp ranks)
    reduce_dtype: str = ""           # dtype of gradient reduction ("fp32": FSDP's fp32 reduce; "": as dtype)
    kernels: str = "fused"           # "eager": norms, rotary, SwiGLU as separate PyTorch ops (no torch.compile)
    tp_overlap: bool = False         # Megatron's --tp-comm-overlap: TP collectives pipelined with their GEMMs

    def __post_init__(self):
        dims.check(dp=self.dp, tp=self.tp, pp=self.pp, zero_stage=self.zero_stage, owner="Strategy")  # the Plan's rules
        for name in ("micro_batch", "num_micro_batches", "virtual_stages"):
            _positive_int(name, getattr(self, name))
        if not self.bucket_bytes or self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {self.bucket_bytes!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule == "interleaved" and self.pp > 1 and self.num_micro_batches % self.pp:
            raise ValueError(f"interleaved 1F1B needs num_micro_batches ({self.num_micro_batches}) to be a "
                             f"multiple of pp ({self.pp})")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 only makes sense with schedule='interleaved'")
        if self.threads is not None:
            _positive_int("threads", self.threads)
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.shard_size:
            _positive_int("shard_size", self.shard_size)
            if not self.fsdp or self.dp % self.shard_size:
                raise ValueError(f"shard_size ({self.shard_size}) is FSDP hybrid sharding: it needs fsdp=True and "
                                 f"must divide dp ({self.dp})")
        if self.fsdp and self.zero_stage not in (2, 3):
            raise ValueError("fsdp=True shards as FSDP does: use zero_stage=3 (FULL_SHARD) or 2 (SHARD_GRAD_OP)")
        if self.tp_overlap and not (self.sequence_parallel and self.tp > 1):
            raise ValueError("tp_overlap overlaps sequence parallelism's all-gathers and reduce-scatters with the "
                             "GEMMs (Megatron's --tp-comm-overlap needs --sequence-parallel): set "
                             "sequence_parallel=True and tp > 1")
        if self.kernels not in ("fused", "eager"):
            raise ValueError(f"kernels must be 'fused' or 'eager', got {self.kernels!r}")
        if self.reduce_dtype not in ("",) + DTYPES:
            raise ValueError(f"reduce_dtype must be '' or one of {DTYPES}, got {self.reduce_dtype!r}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas: dp × micro_batch × num_micro_batches."""
        return self.dp * self.micro_batch * self.num_micro_batches

    @property
    def shard_degree(self) -> int:
        """Ranks each parameter/gradient/optimizer state is sharded over under ZeRO/FSDP."""
        return self.shard_size or self.dp

    @property
    def mixed_precision(self) -> bool:
        return self.dtype in ("bf16", "fp16", "fp8")

    def validate(self, world_size: int | None = None, model=None, hardware=None) -> "Strategy":
        """Check the degrees against a world size, a model and a machine; return self (raises ValueError)."""
        if world_size is not None:
            dims.check(dp=self.dp, tp=self.tp, pp=self.pp, world_size=world_size, owner="Strategy")
        if model is not None:
            chunks = self.pp * self.virtual_stages
            if model.layers % chunks:
                raise ValueError(f"{model.layers} layers do not split into pp × virtual_stages = {chunks} equal "
                                 "stages")
            if model.kind == "gpt":
                if model.heads % self.tp:
                    raise ValueError(f"{model.heads} attention heads do not split over tp = {self.tp}")
                if model.ffn % self.tp or model.hidden % self.tp:
                    raise ValueError(f"hidden {model.hidden} or MLP width {model.ffn} does not split over "
                                     f"tp = {self.tp}")
            elif self.tp > 1:
                if any(o % self.tp for _, o in model.linears):
                    raise ValueError(f"a Linear's width does not split over tp = {self.tp}")
        if hardware is not None and not self.tp_across_nodes:
            g = hardware.devices_per_node
            if self.tp > g:
                raise ValueError(f"tp = {self.tp} spans more than one node ({g} devices per node on "
                                 f"{hardware.name}): tensor parallelism all-reduces every layer and needs the "
                                 f"intra-node links. Use tp <= {g} (and pp or dp for the rest), or pass "
                                 "tp_across_nodes=True to price it on the inter-node link")
            if g % self.tp:
                raise ValueError(f"tp = {self.tp} does not divide the {g} devices of a node, so some "
                                 "tensor-parallel groups would straddle two nodes. Use a divisor of "
                                 f"{g}, or pass tp_across_nodes=True")
        return self

    def replace(self, **changes) -> "Strategy":
        return replace(self, **changes)

    @classmethod
    def from_plan(cls, plan, global_batch: int, **overrides) -> "Strategy":
        """The strategy a ``simlib.train.Plan`` runs for ``global_batch`` samples per step: the same degrees,
        micro-batches, ZeRO stage, precision, recomputation and buckets. The plan is checked first by its own
        ``validate`` (the trainer's check, so a plan the trainer refuses is refused here). ``overrides``: what a
        plan does not say (``optimizer``, ``threads``, ``sequence_parallel``, ...)."""
        plan.validate(plan.world_size)
        if getattr(plan, "cp", 1) > 1 or getattr(plan, "ep", 1) > 1:
            raise ValueError(f"Strategy prices dp, tp and pp; cp={plan.cp} and ep={plan.ep} are priced by "
                             "simlib.sim.context_experts (context-parallel attention, MoE all-to-alls)")
        per_step = plan.accumulation * plan.microbatches
        dims.check(dp=plan.dp, global_batch=global_batch, accumulation=plan.accumulation,
                   microbatches=plan.microbatches)
        if plan.pp > 1 and plan.accumulation > 1:
            raise ValueError(f"the simulator prices one pipeline flush per step; the plan runs {plan.accumulation}: "
                             f"simulate pp_microbatches={per_step}, accumulation=1 (the same samples, one flush)")
        fields = dict(dp=plan.dp, tp=plan.tp, pp=plan.pp, micro_batch=global_batch // (plan.dp * per_step),
                      num_micro_batches=per_step, zero_stage=plan.zero_stage, schedule=plan.schedule,
                      bucket_bytes=plan.bucket_cap_mb * 2 ** 20, overlap=plan.dp_variant in ("bucket", "ddp"),
                      recompute="full" if plan.activation_checkpointing else "none",
                      dtype=plan.mixed_precision or "fp32",
                      sequence_parallel=getattr(plan, "sequence_parallel", False))
        return cls(**{**fields, **overrides})
