"""Which rank this process is, from torch.distributed or, before it is initialised, torchrun's variables.

Example:
    >>> from tbmem._internal.ranks.context import RankInfo, detect_rank
    >>> info = detect_rank(environ={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    >>> info, info.distributed
    (RankInfo(rank=3, world_size=4, local_rank=1, source='env'), True)
    >>> info.run_dir("runs/exp")
    'runs/exp/rank3'
    >>> detect_rank(environ={}).distributed
    False
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping

from tbmem._internal.logdir.layout import rank_dir

__all__ = ["RankInfo", "detect_rank", "distributed_ready"]


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job.

    Attributes:
        rank: Global rank (0 for a single process).
        world_size: Number of ranks (1 for a single process).
        local_rank: Rank on this node (``LOCAL_RANK``), or None when unknown.
        source: ``"dist"`` (an initialised process group), ``"env"`` (torchrun's variables
            before the group exists) or ``"single"``.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    source: str = "single"

    @property
    def distributed(self) -> bool:
        """Whether the job has more than one rank."""
        return self.world_size > 1

    @property
    def is_root(self) -> bool:
        """Whether this is rank 0, the rank that writes the cross-rank aggregates."""
        return self.rank == 0

    def run_dir(self, log_dir: str) -> str:
        """``<log_dir>/rank<r>``: this rank's run folder (:func:`tbmem._internal.logdir.layout.rank_dir`)."""
        return rank_dir(log_dir, self.rank)


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def distributed_ready() -> bool:
    """Whether torch.distributed has a default process group (False if it is not even loaded).

    Looks at ``sys.modules`` first: a process that never imported torch.distributed has no
    group, and checking must not import it (it is slow and pulls in optional backends).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a half-torn-down group is no group
        return False


def detect_rank(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank: the default process group's when it exists, else torchrun's variables.

    Args:
        environ: Variables to read instead of ``os.environ`` (tests); with it, the process
            group is not consulted.
    """
    env = os.environ if environ is None else environ
    local = _int(env, "LOCAL_RANK")
    if environ is None and distributed_ready():
        import torch.distributed as dist

        return RankInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local,
                        source="dist")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is not None and world is not None and world > 1 and rank < world:
        return RankInfo(rank=rank, world_size=world, local_rank=local, source="env")
    return RankInfo()
