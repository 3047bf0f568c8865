"""The rank grid: which ranks share data, pipeline, context and tensor parallel groups.

One line makes the grid obvious (picotron's ``ProcessGroupManager``), here kept in a small validated value
instead of a global:

    grid = torch.arange(world_size).view(dp, pp, cp, tp)     # grid[d, p, c, t] is a global rank

Ranks that differ only in the tensor coordinate form a tensor-parallel group (neighbours, so on a GPU node
they share the fastest links), ranks that differ only in the pipeline coordinate a pipeline, ranks that
differ only in the context coordinate hold the pieces of the same sequences (ring attention), ranks that
differ only in the data coordinate hold other samples. The ``dp x cp`` ranks of one (pipeline, tensor)
position hold the same weights and average their gradients (Megatron-LM's data-parallel group "with context
parallelism"). Expert parallelism cuts those ``dp x cp`` ranks, in rank order, into groups of ``ep``
consecutive ranks that share their experts out (``ep_group``); the ranks holding the same experts average
those experts' gradients (``expert_dp_group``). ``ep`` does not change the world size.

    mesh = Mesh(dp=2, pp=2)                 # world size 4
    groups = mesh.build()                   # on every rank, inside simlib.launch: creates the process groups
    groups.pp_rank, groups.pp_group, groups.dp_group, groups.pp_is_last_stage
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dims

AXES = ("dp", "pp", "cp", "tp")  # the grid's dimensions, outermost first
# groups made by Mesh.build, per (world group, axis, ranks, timeout): a warm cluster that trains plan after plan makes
# each group once. Never destroyed, every Gloo group keeps its threads (a TCP loop and workers) to the end of
# the process: 64 runs of a 4-rank sweep left ~400 threads per rank and slowed the later runs by a third.
_GROUPS: dict = {}
GROUPS = AXES + ("dp_cp", "ep", "expert_dp")  # and the groups built from them


@dataclass(frozen=True)
class Mesh:
    """Sizes of the data, pipeline, tensor and context parallel dimensions (their product is the world size),
    and the expert-parallel degree ``ep``, which divides ``dp x cp``."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        dims.check(dp=self.dp, pp=self.pp, tp=self.tp, cp=self.cp, ep=self.ep, owner="mesh")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def grid(self) -> torch.Tensor:
        """``grid[d, p, c, t]`` = global rank; tensor-parallel neighbours are consecutive ranks."""
        return torch.arange(self.world_size).view(self.dp, self.pp, self.cp, self.tp)

    def coords(self, rank: int) -> dict:
        """``{"dp": d, "pp": p, "cp": c, "tp": t, "ep": e}`` of a global rank (``ep``: its place in its
        expert-parallel group)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        d, p, c, t = (int(i) for i in (self.grid == rank).nonzero()[0])
        return dict(dp=d, pp=p, cp=c, tp=t, ep=(d * self.cp + c) % self.ep)

    def groups_of(self, axis: str) -> list[list[int]]:
        """Every group along ``axis`` (one of :data:`GROUPS`): lists of global ranks."""
        if axis not in GROUPS:
            raise ValueError(f"unknown axis {axis!r}: use one of {GROUPS}")
        if axis in AXES:  # ranks that differ only in that coordinate
            dim = AXES.index(axis)
            moved = self.grid.movedim(dim, -1).reshape(-1, getattr(self, axis))
            return [row.tolist() for row in moved]
        # the dp x cp ranks of each (pp, tp) position, in rank order
        tokens = self.grid.permute(1, 3, 0, 2).reshape(-1, self.dp * self.cp)
        if axis == "dp_cp":
            return [row.tolist() for row in tokens]
        if axis == "ep":  # consecutive blocks of ep ranks
            return [block.tolist() for row in tokens for block in row.view(-1, self.ep)]
        return [col.tolist() for row in tokens for col in row.view(-1, self.ep).T]  # expert_dp: strided

    def check_world(self, world_size: int) -> None:
        dims.check(dp=self.dp, pp=self.pp, tp=self.tp, cp=self.cp, ep=self.ep, world_size=world_size, owner="mesh")

    def build(self, timeout: float | None = None) -> MeshGroups:
        """Create the process groups (a collective: every rank calls it, in the same order).

        ``timeout`` (seconds) bounds every collective on them; default: the world group's (``simlib.init``'s
        ``timeout``), never torch's 30-minute default, so a stopped peer fails the run in that time."""
        import datetime

        import torch.distributed as dist

        from .. import env

        rank = dist.get_rank()
        self.check_world(dist.get_world_size())
        limit = datetime.timedelta(seconds=timeout) if timeout is not None else env.collective_timeout()
        mine = {}
        extra = ("dp_cp", "ep", "expert_dp") if self.cp > 1 or self.ep > 1 else ()  # else dp_cp is dp
        world = dist.group.WORLD
        for key in [k for k in _GROUPS if k[0] is not world]:  # groups of a world that has gone
            del _GROUPS[key]
        for axis in AXES + extra:  # every rank must take part in creating every group (or none: all reuse it)
            for ranks in self.groups_of(axis):
                key = (world, axis, tuple(ranks), limit)  # one per axis, as before: no two axes share one
                if key not in _GROUPS:
                    _GROUPS[key] = dist.new_group(ranks, timeout=limit)
                group = _GROUPS[key]
                if rank in ranks:
                    mine[axis] = group
        c = self.coords(rank)
        return MeshGroups(
            self,
            rank,
            c["dp"],
            c["pp"],
            c["tp"],
            mine["dp"],
            mine["pp"],
            mine["tp"],
            cp_rank=c["cp"],
            cp_group=mine["cp"],
            dp_cp_group=mine.get("dp_cp", mine["dp"]),
            ep_rank=c["ep"],
            ep_group=mine.get("ep"),
            expert_dp_group=mine.get("expert_dp"),
        )


@dataclass(frozen=True)
class MeshGroups:
    """One rank's view of the mesh: its coordinates and the process group along each axis."""

    mesh: Mesh
    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object
    pp_group: object
    tp_group: object
    cp_rank: int = 0
    cp_group: object = None
    dp_cp_group: object = None  # the ranks that average gradients: dp x cp (the dp group when cp = 1)
    ep_rank: int = 0
    ep_group: object = None  # built when cp > 1 or ep > 1: experts shared out over it
    expert_dp_group: object = None  # the ranks holding the same experts

    @property
    def pp_is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def pp_is_last_stage(self) -> bool:
        return self.pp_rank == self.mesh.pp - 1

    def __repr__(self) -> str:
        cp = f", cp_rank={self.cp_rank}" if self.mesh.cp > 1 else ""
        ep = f", ep_rank={self.ep_rank}" if self.mesh.ep > 1 else ""
        return (
            f"MeshGroups(rank={self.rank}, dp_rank={self.dp_rank}, pp_rank={self.pp_rank}, "
            f"tp_rank={self.tp_rank}{cp}{ep})"
        )
