"""The rank grid: which ranks share data, pipeline and tensor parallel groups.

One line makes the grid obvious (picotron's ``ProcessGroupManager``), here kept in a small validated value
instead of a global:

    grid = torch.arange(world_size).view(dp, pp, tp)     # grid[d, p, t] is a global rank

Ranks that differ only in the tensor coordinate form a tensor-parallel group (neighbours, so on a GPU node
they share the fastest links), ranks that differ only in the pipeline coordinate a pipeline, ranks that
differ only in the data coordinate hold the same weights and all-reduce gradients.

    mesh = Mesh(dp=2, pp=2)                 # world size 4
    groups = mesh.build()                   # on every rank, inside simlib.launch: creates the process groups
    groups.pp_rank, groups.pp_group, groups.dp_group, groups.pp_is_last_stage
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

AXES = ("dp", "pp", "tp")


@dataclass(frozen=True)
class Mesh:
    """Sizes of the data, pipeline and tensor parallel dimensions; their product is the world size."""

    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self):
        for axis in AXES:
            value = getattr(self, axis)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{axis} size must be a positive int, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def grid(self) -> torch.Tensor:
        """``grid[d, p, t]`` = global rank; tensor-parallel neighbours are consecutive ranks."""
        return torch.arange(self.world_size).view(self.dp, self.pp, self.tp)

    def coords(self, rank: int) -> dict:
        """``{"dp": d, "pp": p, "tp": t}`` of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        d, p, t = (int(i) for i in (self.grid == rank).nonzero()[0])
        return dict(dp=d, pp=p, tp=t)

    def groups_of(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: lists of global ranks that differ only in that coordinate."""
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}: use one of {AXES}")
        dim = AXES.index(axis)
        moved = self.grid.movedim(dim, -1).reshape(-1, getattr(self, axis))
        return [row.tolist() for row in moved]

    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(f"mesh dp={self.dp} x pp={self.pp} x tp={self.tp} needs {self.world_size} ranks, "
                             f"the world has {world_size}")

    def build(self, timeout: float | None = None) -> "MeshGroups":
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
        for axis in AXES:  # every rank must take part in creating every group
            for ranks in self.groups_of(axis):
                group = dist.new_group(ranks, timeout=limit)
                if rank in ranks:
                    mine[axis] = group
        c = self.coords(rank)
        return MeshGroups(self, rank, c["dp"], c["pp"], c["tp"], mine["dp"], mine["pp"], mine["tp"])


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

    @property
    def pp_is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def pp_is_last_stage(self) -> bool:
        return self.pp_rank == self.mesh.pp - 1

    def __repr__(self) -> str:
        return f"MeshGroups(rank={self.rank}, dp_rank={self.dp_rank}, pp_rank={self.pp_rank}, tp_rank={self.tp_rank})"
