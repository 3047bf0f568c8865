"""Seeds for data made on the fly (augmentations, Monte-Carlo paths), and the check for the classic bug.

The rule: a random draw belongs to a *sample* (or a fixed block of samples), never to a rank. Seed it from
``(seed, step, index)`` and the global batch is the same whatever the world size, so a 4-rank run can be
compared with a 1-rank run step for step, and no two ranks ever draw the same numbers.

The bug it prevents: every rank calls ``torch.manual_seed(seed)`` and draws "its own" random data. Each rank
then draws *the same* data; the run looks fine (loss goes down) but the global batch holds ``world_size``
copies of one local batch. :func:`duplicate_parts` (one process) and :func:`check_distinct` (on the ranks,
one all_gather) find it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["mix", "generator", "fingerprints", "duplicate_parts", "check_distinct", "DuplicateDataError"]


class DuplicateDataError(RuntimeError):
    """Two ranks (or parts of one global batch) hold identical samples: a seeding bug."""


def mix(*keys: int) -> int:
    """A well-mixed 63-bit seed from integer keys (numpy's SeedSequence; nearby keys give unrelated streams)."""
    for k in keys:
        if not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"seed keys must be non-negative ints, got {keys!r}")
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def generator(*keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`mix` of ``keys`` (e.g. ``(seed, step, block)``)."""
    return torch.Generator().manual_seed(mix(*keys))


def fingerprints(x: torch.Tensor) -> torch.Tensor:
    """One int64 per sample (row): a hash of its values, to compare samples across ranks cheaply."""
    flat = x.detach().reshape(x.shape[0], -1).to(torch.float64).cpu()
    weights = torch.linspace(1.0, 2.0, flat.shape[1], dtype=torch.float64)
    return torch.round((flat * weights).sum(1) * 1e6).to(torch.int64)


def duplicate_parts(parts: list) -> list[tuple[int, int]]:
    """Pairs (i, j) of parts (ranks' shards) whose samples are identical: [] when every part is its own."""
    prints = [fingerprints(p) for p in parts]
    return [
        (i, j)
        for i in range(len(prints))
        for j in range(i + 1, len(prints))
        if prints[i].shape == prints[j].shape and torch.equal(prints[i], prints[j])
    ]


def check_distinct(x: torch.Tensor, group=None, what: str = "batch") -> None:
    """On every rank: all_gather a fingerprint of this rank's ``x``; raise on every rank if two are equal.

    Raises :class:`DuplicateDataError` naming the ranks and the likely cause (the same seed on every rank).
    """
    world = dist.get_world_size(group)
    mine = fingerprints(x)
    if dist.get_backend(group) == "nccl":  # NCCL gathers GPU tensors only (Gloo takes CPU ones on any device)
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    gathered = [g.cpu() for g in gathered]
    same = duplicate_parts([g.unsqueeze(1) for g in gathered])
    if same:
        pairs = ", ".join(f"ranks {i} and {j}" for i, j in same)
        raise DuplicateDataError(
            f"{pairs} drew identical {what}es ({x.shape[0]} samples each): every rank seeds its random data the "
            f"same way, so the global batch holds {world} copies of one local batch. Seed each draw from "
            f"(seed, step, sample or block index) - simlib.projects.seeding.generator - not from a seed shared "
            f"by all ranks."
        )
