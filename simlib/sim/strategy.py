"""How a job is split: data, tensor and pipeline degrees, micro-batches, ZeRO, buckets, overlap, recomputation.

The rank grid is ``arange(world_size).view(dp, pp, cp, tp)`` (tensor-parallel ranks adjacent, so they share a
node, as in Megatron-LM and picotron; then context-parallel ones; ``simlib.parallel.mesh`` uses the same order),
and expert parallelism cuts the dp × cp ranks that hold tokens into groups of ``ep`` consecutive ones (it adds no
ranks: Megatron-LM folds expert parallelism into data parallelism; under Megatron's rank order, ``pipeline_outer``,
its expert grid takes the tp × cp × dp ranks, so an expert group is ``ep`` consecutive ranks whatever tp is); :class:`Strategy` validates the degrees
instead of keeping globals, and against a machine: a tensor-parallel group must sit inside one node (tp divides the node's devices) unless
``tp_across_nodes=True`` asks for it (then it is priced on the inter-node link). ``simlib.sim.topology`` places
every group of the grid on the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..parallel import dims

RECOMPUTE = ("none", "selective", "op", "every_other", "full")
RECOMPUTE_MODULES = ("layernorm", "moe_act", "mla_up_proj", "mlp", "moe")  # Megatron's --recompute-modules (layer.py)
ATTENTION = ("unfused", "flash", "flash1", "cudnn")
EP_DISPATCHERS = ("alltoall", "deepep")  # Strategy.ep_dispatcher


def expert_grid_folds_tp(s) -> bool:
    """Whether the expert groups are cut from the tp × cp × dp ranks (Megatron-Core's expert grid: its rank order,
    ``pipeline_outer``, or an ``ep`` beyond dp × cp, MoE parallel folding) rather than from the dp × cp ranks of one
    tensor-parallel rank (``simlib.parallel.mesh``'s order). Read by :attr:`Strategy.expert_dp` and
    ``topology.group_ranks``; any object with the degrees will do."""
    cp = getattr(s, "cp", 1)
    return bool(getattr(s, "pipeline_outer", False)) or getattr(s, "ep", 1) > s.dp * cp


SCHEDULES = ("1f1b", "gpipe", "interleaved")
CP_KINDS = ("allgather", "ring", "ulysses")
FP8_RECIPES = ("delayed", "current", "blockwise", "mx")
DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8", "fp4")
OPTIMIZERS = ("adam", "sgd", "sgd_momentum")
HEADS = ("parallel", "whole")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Strategy:
    dp: int = 1  # data-parallel degree (replicas)
    tp: int = 1  # tensor-parallel degree (Megatron column/row splits)
    pp: int = 1  # pipeline-parallel degree (stages)
    micro_batch: int = 1  # samples per micro-batch on one data-parallel rank
    num_micro_batches: int = 1  # accumulation steps (pp = 1) or pipeline micro-batches per step
    zero_stage: int = 0  # 0: replicate; 1: shard optimizer states; 2: + gradients; 3: + weights
    bucket_bytes: float = 25e6  # gradient bucket (PyTorch DDP's default is 25 MB)
    overlap: bool = False  # all-reduce buckets while backward still runs
    recompute: str = "none"  # activation recomputation: none | selective | op | every_other | full
    attention: str = "unfused"  # "flash": one fused kernel (FlashAttention-2), no s×s scores in memory;
    # "flash1": FlashAttention-1 / the Triton kernel (slower); "cudnn": cuDNN's fused attention, which Transformer
    # Engine (Megatron-Core, NeMo) picks over FlashAttention-2 on Hopper and later
    schedule: str = "1f1b"  # pipeline schedule: 1f1b | gpipe | interleaved
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    sequence_parallel: bool = False  # with tp > 1: shard layer norms/dropout along the sequence (Korthikanti)
    tp_across_nodes: bool = False  # allow a tensor-parallel group to span nodes (priced on the inter-node link)
    dtype: str = "bf16"  # compute dtype; bf16/fp16 mean mixed precision with fp32 master weights
    optimizer: str = "adam"
    threads: int | None = None  # CPU only: torch threads per process (None: cores // processes)
    fsdp: bool = False  # shard as PyTorch FSDP does: zero_stage 3 = FULL_SHARD, 2 = SHARD_GRAD_OP;
    # per layer all-gather / reduce-scatter every micro-batch, prefetched
    shard_size: int = 0  # FSDP hybrid sharding: shard over groups of this many ranks, replicate
    # across them (0: shard over all dp ranks)
    reduce_dtype: str = ""  # dtype of gradient reduction ("fp32": FSDP's fp32 reduce; "": as dtype)
    kernels: str = "fused"  # "eager": norms, rotary, SwiGLU as separate PyTorch ops (no torch.compile)
    tp_overlap: bool = False  # Megatron's --tp-comm-overlap: TP collectives pipelined with their GEMMs
    # ── cluster scale (all default to "off", so older strategies mean what they meant) ──
    cp: int = 1  # context-parallel degree: each sequence split over cp ranks (zig-zag)
    cp_kind: str = "allgather"  # "allgather": K/V all-gathered before attention (Llama 3); "ring": K/V
    # passed around the ring, overlapped with the blocks (TE's p2p); "ulysses":
    # all-to-all from sequence to heads and back (DeepSpeed-Ulysses)
    ep: int = 1  # expert-parallel degree: the routed experts shared out over ep of the
    # dp × cp ranks (their tokens sent by all-to-all); divides dp × cp
    expert_imbalance: float = 1.0  # tokens on the busiest expert-parallel rank over the mean (router balance)
    recompute_layers: int = 0  # with recompute="full": only this many layers per stage recomputed
    # (Megatron's --recompute-num-layers with --recompute-method block; 0: all)
    first_stage_layers: int = 0  # uneven pipeline: layers on the first / last stage (Megatron's
    last_stage_layers: int = 0  # --decoder-first/last-pipeline-num-layers; 0: an even share), the rest
    # split evenly over the middle stages
    pipeline_flushes: int = 1  # pp > 1: pipeline flushes per step (a plan that accumulates over pipeline
    # passes flushes once per pass); num_micro_batches counts all of them
    pipeline_outer: bool = False  # Megatron-LM's rank order (tp-cp-ep-dp-pp): pipeline stages outermost, so a
    # data-/expert-parallel group is tp·cp ranks apart (not tp·cp·pp)
    recompute_modules: tuple = ()  # with recompute none/selective: Megatron's --recompute-modules, re-run in
    # backward (layernorm, moe_act, mla_up_proj, mlp; layer_strategy.module_recompute_ops)
    ep_overlap: bool = False  # Megatron's --overlap-moe-expert-parallel-comm: the dispatch/combine all-to-
    # alls of one micro-batch run beside another's compute (1F1B steady state)
    ep_dispatcher: str = "alltoall"  # how tokens reach their experts across nodes: "alltoall" (Megatron's
    # alltoall dispatcher: each of a token's top-k copies crosses on its own) or "deepep" (DeepEP / HybridEP,
    # Megatron's flex dispatcher: a token crosses once to each node holding any of its experts, then NVLink)
    stage_layout: tuple = ()  # pp > 1: layers on each pipeline rank, first to last, all its model chunks
    # together (Megatron's --pipeline-model-parallel-layout summed per rank;
    # DeepSeek-V3's recipes); empty: even, or first/last_stage_layers
    offload_layers: int = 0  # Megatron's --cpu-offloading-num-layers: that many layers' activations go to
    # host memory in forward and come back in backward (simlib.sim.offload)
    fp8_recipe: str = "delayed"  # dtype="fp8": Transformer Engine's scaling recipe (delayed / current
    # per-tensor, blockwise 1x128 as DeepSeek-V3, mx: MXFP8 on Blackwell)
    param_gather_overlap: bool = False  # ZeRO 1/2 (Megatron's distributed optimizer): reduce-scatter each
    # gradient bucket under backward and all-gather its updated parameters under the next step's first forward
    # (--overlap-grad-reduce --overlap-param-gather) instead of an all-reduce (hidden only with overlap)
    fp8_param_gather: bool = False  # dtype fp8/fp4: parameters all-gathered in FP8, 1 byte each (Megatron's
    # --fp8-param-gather, torchtitan's enable_fsdp_float8_all_gather)
    head: str = "parallel"  # GPT: the embedding, the output layer and the loss. "parallel" (Megatron-LM):
    # split over tp (VocabParallelEmbedding, the parallel LM head, a fused
    # cross-entropy keeping one fp32 copy of the logits), the vocabulary's
    # parameters spread evenly over the pipeline stages as the published runs are
    # priced; "whole" (simlib's GPT, set by from_plan): embedding and tied head
    # whole on every tp rank, the embedding on the first stage and the head's copy
    # of it on the last, torch's cross_entropy (simlib.sim.memory says what it keeps)

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
            raise ValueError(
                f"interleaved 1F1B needs num_micro_batches ({self.num_micro_batches}) to be a "
                f"multiple of pp ({self.pp})"
            )
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 only makes sense with schedule='interleaved'")
        if self.threads is not None:
            _positive_int("threads", self.threads)
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.shard_size:
            _positive_int("shard_size", self.shard_size)
            if not self.fsdp or self.dp % self.shard_size:
                raise ValueError(
                    f"shard_size ({self.shard_size}) is FSDP hybrid sharding: it needs fsdp=True and "
                    f"must divide dp ({self.dp})"
                )
        if self.fsdp and self.zero_stage not in (2, 3):
            raise ValueError("fsdp=True shards as FSDP does: use zero_stage=3 (FULL_SHARD) or 2 (SHARD_GRAD_OP)")
        if self.tp_overlap and not (self.sequence_parallel and self.tp > 1):
            raise ValueError(
                "tp_overlap overlaps sequence parallelism's all-gathers and reduce-scatters with the "
                "GEMMs (Megatron's --tp-comm-overlap needs --sequence-parallel): set "
                "sequence_parallel=True and tp > 1"
            )
        if self.param_gather_overlap and (self.zero_stage not in (1, 2) or self.fsdp):
            raise ValueError(
                "param_gather_overlap is the distributed optimizer's overlap (reduce-scatter under backward, "
                "all-gather under the next forward): it needs zero_stage 1 or 2 and fsdp=False"
            )
        if self.fp8_param_gather and self.dtype not in ("fp8", "fp4"):
            raise ValueError(f"fp8_param_gather keeps FP8 weights: it needs dtype fp8 or fp4, got {self.dtype!r}")
        if self.kernels not in ("fused", "eager"):
            raise ValueError(f"kernels must be 'fused' or 'eager', got {self.kernels!r}")
        if self.reduce_dtype not in ("",) + DTYPES:
            raise ValueError(f"reduce_dtype must be '' or one of {DTYPES}, got {self.reduce_dtype!r}")
        _check_scale(self)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def vocab_tp(self) -> int:
        """Ranks a GPT's embedding and logits are split over: tp under Megatron's parallel head, 1 under simlib's
        whole head (``head="whole"``: every tp rank runs the whole logits GEMM and loss)."""
        return 1 if self.head == "whole" else self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts, which average their gradients: dp × cp / ep (tp × dp × cp / ep under
        Megatron's rank order, whose expert grid folds the tensor-parallel ranks in: ``topology.group_ranks``)."""
        return max(1, self.dp * self.cp * (self.tp if expert_grid_folds_tp(self) else 1) // self.ep)

    def offloaded(self, layers_here: float) -> float:
        """Layers of a stage whose activations live in host memory (``offload_layers``, simlib.sim.offload): at
        most the stage's ``layers_here`` (a fraction where an even share of layers does not divide)."""
        return min(self.offload_layers, max(layers_here, 0))

    def stage_layers(self, layers: int) -> list[int]:
        """Layers on each pipeline stage: ``first_stage_layers`` / ``last_stage_layers`` where set, the rest
        spread evenly over the other stages (raises ValueError if they do not split evenly)."""
        return _stage_layers(self, layers)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas: dp × micro_batch × num_micro_batches."""
        return self.dp * self.micro_batch * self.num_micro_batches

    @property
    def shard_degree(self) -> int:
        """Ranks each (dense) parameter/gradient/optimizer state is sharded over under ZeRO/FSDP: dp × cp
        (context-parallel ranks hold the same weights: Megatron's distributed optimizer shards over both)."""
        return self.shard_size or self.dp * self.cp

    @property
    def mixed_precision(self) -> bool:
        return self.dtype in ("bf16", "fp16", "fp8", "fp4")

    def validate(self, world_size: int | None = None, model=None, hardware=None) -> Strategy:
        """Check the degrees against a world size, a model and a machine; return self (raises ValueError)."""
        if world_size is not None:
            dims.check(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, world_size=world_size, owner="Strategy")
        if model is not None:
            _check_scale_model(self, model)
            chunks = self.pp * self.virtual_stages
            if self.first_stage_layers or self.last_stage_layers or self.stage_layout:
                self.stage_layers(model.layers)
            elif model.layers % chunks and (self.virtual_stages == 1 or (model.layers + 2) % chunks):
                # (Megatron's account_for_embedding/loss_in_pipeline_split: embedding and loss count as a layer
                # each, so 126 + 2 layers split into 8 x 8 chunks)
                raise ValueError(f"{model.layers} layers do not split into pp × virtual_stages = {chunks} equal stages")
            if model.kind == "gpt":
                if model.heads % self.tp:
                    raise ValueError(f"{model.heads} attention heads do not split over tp = {self.tp}")
                if model.ffn % self.tp or model.hidden % self.tp:
                    raise ValueError(
                        f"hidden {model.hidden} or MLP width {model.ffn} does not split over tp = {self.tp}"
                    )
            elif self.tp > 1:
                if any(o % self.tp for _, o in model.linears):
                    raise ValueError(f"a Linear's width does not split over tp = {self.tp}")
        if hardware is not None and not self.tp_across_nodes:
            g = hardware.devices_per_node
            if self.tp > g:
                raise ValueError(
                    f"tp = {self.tp} spans more than one node ({g} devices per node on "
                    f"{hardware.name}): tensor parallelism all-reduces every layer and needs the "
                    f"intra-node links. Use tp <= {g} (and pp or dp for the rest), or pass "
                    "tp_across_nodes=True to price it on the inter-node link"
                )
            if g % self.tp:
                raise ValueError(
                    f"tp = {self.tp} does not divide the {g} devices of a node, so some "
                    "tensor-parallel groups would straddle two nodes. Use a divisor of "
                    f"{g}, or pass tp_across_nodes=True"
                )
        return self

    def replace(self, **changes) -> Strategy:
        return replace(self, **changes)

    @classmethod
    def from_plan(cls, plan, global_batch: int, **overrides) -> Strategy:
        """The strategy a ``simlib.train.Plan`` runs for ``global_batch`` samples per step: the same degrees,
        micro-batches, ZeRO stage, precision, recomputation and buckets. The plan is checked first by its own
        ``validate`` (the trainer's check, so a plan the trainer refuses is refused here). ``overrides``: what a
        plan does not say (``optimizer``, ``threads``, ``sequence_parallel``, ...).

        Every sample of a step goes through the plan's accumulation × pipeline micro-batches on each data-parallel
        rank, so micro_batch = global_batch / (dp × accumulation × pp_microbatches). A pipeline plan that also
        accumulates flushes its pipeline ``accumulation`` times a step (``pipeline_flushes``: a bubble each).
        ``head="whole"``: the course's GPT keeps its embedding and tied head whole under tp, on the first and last
        pipeline stages (:mod:`simlib.projects.gpt.model`). cp and ep map one to one (cp splits each sequence with
        the plan's zig-zag ring attention, ``cp_kind="ring"`` unless overridden)."""
        plan.validate(plan.world_size)
        per_step = plan.accumulation * plan.microbatches
        dims.check(
            dp=plan.dp, global_batch=global_batch, accumulation=plan.accumulation, microbatches=plan.microbatches
        )
        fields = dict(
            dp=plan.dp,
            tp=plan.tp,
            pp=plan.pp,
            cp=plan.cp,
            ep=plan.ep,
            micro_batch=global_batch // (plan.dp * per_step),
            num_micro_batches=per_step,
            zero_stage=plan.zero_stage,
            schedule=plan.schedule,
            bucket_bytes=plan.bucket_cap_mb * 2**20,
            overlap=plan.dp_variant in ("bucket", "ddp"),
            recompute="full" if plan.activation_checkpointing else "none",
            dtype=plan.mixed_precision or "fp32",
            sequence_parallel=plan.sequence_parallel,
            head="whole",
        )
        if plan.pp > 1:
            fields["pipeline_flushes"] = plan.accumulation
        if fields["cp"] > 1:
            fields["cp_kind"] = "ring"  # simlib's context parallelism is zig-zag ring attention
        return cls(**{**fields, **overrides})


def _stage_layers(s, layers: int) -> list[int]:
    if s.pp == 1:
        return [layers]
    if s.stage_layout:
        if len(s.stage_layout) != s.pp or sum(s.stage_layout) != layers:
            raise ValueError(
                f"stage_layout {s.stage_layout} must give each of the pp = {s.pp} ranks its layers, {layers} in all"
            )
        return list(s.stage_layout)
    first, last = s.first_stage_layers, s.last_stage_layers
    ends = (1 if first else 0) + (1 if last else 0)
    rest, middle = layers - first - last, s.pp - ends
    if rest < 0 or (middle and rest % middle) or (not middle and rest):
        raise ValueError(
            f"{layers} layers do not split as first_stage_layers={first}, last_stage_layers={last} "
            f"and an even share on the other {middle} stage(s): choose ends that leave a multiple of "
            f"{middle or 1}"
        )
    even = rest // middle if middle else 0
    return [first or even] + [even] * (s.pp - 2) + [last or even]


def _check_scale(s) -> None:
    """Strategy's own checks of the cluster-scale fields (cp, ep, uneven stages, partial recompute, FP8 recipe):
    kept apart so that one shared validation can call it."""
    for name in ("cp", "ep", "pipeline_flushes"):
        _positive_int(name, getattr(s, name))
    if s.num_micro_batches % s.pipeline_flushes:
        raise ValueError(
            f"num_micro_batches ({s.num_micro_batches}) counts every flush's micro-batches: it must be "
            f"a multiple of pipeline_flushes ({s.pipeline_flushes})"
        )
    if s.cp_kind not in CP_KINDS:
        raise ValueError(f"cp_kind must be one of {CP_KINDS}, got {s.cp_kind!r}")
    dims.check(dp=s.dp, tp=s.tp, cp=s.cp, ep=s.ep, owner="Strategy", ep_folds_into_tp=True)
    if not s.expert_imbalance >= 1.0:
        raise ValueError(
            f"expert_imbalance is the busiest rank's tokens over the mean: >= 1, got {s.expert_imbalance!r}"
        )
    for name in ("recompute_layers", "first_stage_layers", "last_stage_layers", "offload_layers"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if s.recompute_layers and s.recompute != "full":
        raise ValueError("recompute_layers recomputes that many whole layers per stage: it needs recompute='full'")
    if (s.first_stage_layers or s.last_stage_layers) and (s.pp == 1 or s.virtual_stages > 1):
        raise ValueError("first_stage_layers / last_stage_layers need pp > 1 without interleaving")
    if any(m not in RECOMPUTE_MODULES for m in s.recompute_modules) or (
        s.recompute_modules and s.recompute not in ("none", "selective")
    ):
        raise ValueError(
            f"recompute_modules must be among {RECOMPUTE_MODULES}, with recompute 'none' or "
            f"'selective'; got {s.recompute_modules!r} with recompute={s.recompute!r}"
        )
    if s.ep_overlap and s.ep == 1:
        raise ValueError("ep_overlap hides the expert-parallel all-to-alls: it needs ep > 1")
    if s.ep_dispatcher not in EP_DISPATCHERS:
        raise ValueError(f"ep_dispatcher must be one of {EP_DISPATCHERS}, got {s.ep_dispatcher!r}")
    if s.stage_layout and (s.first_stage_layers or s.last_stage_layers or s.pp == 1):
        raise ValueError("stage_layout needs pp > 1 and replaces first_stage_layers / last_stage_layers")
    if s.head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {s.head!r}")
    if s.fp8_recipe not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe must be one of {FP8_RECIPES}, got {s.fp8_recipe!r}")


def _check_scale_model(s, model) -> None:
    """cp and ep against a model's shape: the zig-zag split needs 2·cp chunks of the sequence, Ulysses heads
    that split over tp × cp, expert parallelism experts that split over ep."""
    if s.cp > 1:
        if model.kind != "gpt":
            raise ValueError("context parallelism splits a sequence: it needs a GPT model")
    dims.check(
        dp=s.dp,
        tp=s.tp,
        cp=s.cp,
        ep=s.ep,
        owner="Strategy",
        ep_folds_into_tp=True,
        task=model.name,
        seq_len=model.seq_len if s.cp > 1 else None,
        heads=model.heads,
        ulysses=s.cp_kind == "ulysses",
        experts=getattr(model, "experts", 0),
    )
    if s.recompute_layers and s.pp > 0 and s.recompute_layers > max(_stage_layers(s, model.layers)):
        raise ValueError(f"recompute_layers={s.recompute_layers} is more than a stage's layers")
