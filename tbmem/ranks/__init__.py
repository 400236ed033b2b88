"""tbmem under torch.distributed: rank folders, cross-rank aggregates, out-of-memory on any rank.

:class:`tbmem.MemoryWriter` uses this package by itself when the job has more than one
rank (see docs/distributed.md); nothing changes in the training script.

Example:
    >>> from tbmem.ranks import detect_rank
    >>> detect_rank(environ={"RANK": "1", "WORLD_SIZE": "2"}).run_dir("runs/job")
    'runs/job/rank1'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "RanksConfig": "tbmem.ranks.config",
    "DEFAULT_RANK_TAGS": "tbmem.ranks.config",
    "RankInfo": "tbmem.ranks.context",
    "detect_rank": "tbmem.ranks.context",
    "distributed_ready": "tbmem.ranks.context",
    "RankAggregator": "tbmem.ranks.aggregate",
    "aggregate_rows": "tbmem.ranks.aggregate",
    "JobStore": "tbmem.ranks.store",
    "OomSignal": "tbmem.ranks.oom",
    "PeerOutOfMemoryError": "tbmem.ranks.oom",
    "RankSupport": "tbmem.ranks.support",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem.ranks.aggregate import RankAggregator, aggregate_rows
    from tbmem.ranks.config import DEFAULT_RANK_TAGS, RanksConfig
    from tbmem.ranks.context import RankInfo, detect_rank, distributed_ready
    from tbmem.ranks.oom import OomSignal, PeerOutOfMemoryError
    from tbmem.ranks.store import JobStore
    from tbmem.ranks.support import RankSupport


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
