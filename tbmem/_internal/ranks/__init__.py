"""tbmem under torch.distributed: rank folders, cross-rank aggregates, out-of-memory on any rank.

:class:`tbmem.MemoryWriter` uses this package by itself when the job has more than one
rank (see docs/distributed.md); nothing changes in the training script.

Example:
    >>> from tbmem._internal.ranks import detect_rank
    >>> detect_rank(environ={"RANK": "1", "WORLD_SIZE": "2"}).run_dir("runs/job")
    'runs/job/rank1'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "RanksConfig": "tbmem._internal.ranks.config",
    "DEFAULT_RANK_TAGS": "tbmem._internal.ranks.config",
    "RankInfo": "tbmem._internal.ranks.context",
    "detect_rank": "tbmem._internal.ranks.context",
    "distributed_ready": "tbmem._internal.ranks.context",
    "RankAggregator": "tbmem._internal.ranks.aggregate",
    "aggregate_rows": "tbmem._internal.ranks.aggregate",
    "JobStore": "tbmem._internal.ranks.store",
    "OomSignal": "tbmem._internal.ranks.oom",
    "PeerOutOfMemoryError": "tbmem._internal.ranks.oom",
    "RankSupport": "tbmem._internal.ranks.support",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.ranks.aggregate import RankAggregator, aggregate_rows
    from tbmem._internal.ranks.config import DEFAULT_RANK_TAGS, RanksConfig
    from tbmem._internal.ranks.context import RankInfo, detect_rank, distributed_ready
    from tbmem._internal.ranks.oom import OomSignal, PeerOutOfMemoryError
    from tbmem._internal.ranks.store import JobStore
    from tbmem._internal.ranks.support import RankSupport


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
