"""What a :class:`tbmem.MemoryWriter` does differently when the job has more than one rank.

The writer creates one :class:`RankSupport` (None for a single process) and calls a few
hooks: the run folder at construction, :meth:`RankSupport.on_log` at every ``log_memory``
call, :meth:`RankSupport.on_record` at every step divisible by ``every`` (every rank,
whatever its local state), :meth:`RankSupport.on_oom` after its own out-of-memory
snapshot, and :meth:`RankSupport.close`. No hook raises.

Example:
    >>> from tbmem._internal.config import MemoryWriterConfig
    >>> from tbmem._internal.ranks.context import RankInfo
    >>> from tbmem._internal.ranks.support import RankSupport
    >>> RankSupport.create(MemoryWriterConfig()) is None  # a single process
    True
    >>> support = RankSupport(RankInfo(rank=1, world_size=2, source="env"), MemoryWriterConfig())
    >>> support.run_dir("runs/exp"), support.writes_aggregates
    ('runs/exp/rank1', False)
    >>> support.close()
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import sys
import threading
from typing import Any, Callable, Mapping

from tbmem._internal._log import logger, report_once
from tbmem._internal.ranks.config import RanksConfig
from tbmem._internal.ranks.context import RankInfo, detect_rank, distributed_ready

__all__ = ["RankSupport"]

_HANDOFF_S = 1.0  # how long the watcher leaves a peer's picture to the training thread
_CLOSE_WAIT_S = 60.0
_INSTANCES = itertools.count(1)  # ranks in step complete the last gather within milliseconds of each other


class RankSupport:
    """Rank folder, cross-rank aggregates and the out-of-memory signal of one writer.

    Args:
        info: This process's rank.
        config: The writer's :class:`tbmem.MemoryWriterConfig`.
    """

    def __init__(self, info: RankInfo, config: Any) -> None:
        ranks = config.ranks if isinstance(config.ranks, RanksConfig) else RanksConfig()
        self.info = info
        self.config = ranks
        self.every = config.every
        self.last_step = 0
        self._write: Callable[[Mapping[str, float], int], None] = lambda values, step: None
        self._snapshots: Callable[[], Any] = lambda: None
        self._flush: Callable[[], None] = lambda: None
        self._store: Any = None
        self._store_tried = False
        self._oom: Any = None
        self._peer: tuple[int, int] | None = None
        self._peer_done = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self.enabled = bool(config.enabled)  # a disabled writer still writes its rank's folder
        # Writers are numbered in creation order, the same on every rank of an SPMD script: each
        # writer's gather, store keys and node socket are its own (a script may open one writer after another).
        self.instance = next(_INSTANCES)
        self.compact = ranks.compact(info.world_size) and ranks.subfolder
        if self.compact and ranks.layout == "auto" and importlib.util.find_spec("pyarrow") is None:
            # compact by default above compact_above ranks, but a job must not fail for a missing extra
            self.compact = False
            report_once("ranks:no-pyarrow", f"tbmem: {info.world_size} ranks would use the compact layout, which "
                        "needs pyarrow (pip install 'tbmem[ranks]'); every rank writes its own run instead")
        self.keep: set[str] = set()  # why this rank's run is kept in the compact layout
        self._channel: Any = None
        self._staging: tuple[str, str] | None = None  # (private folder, <job>/rank<r>) in the compact layout
        self._peaks: Any = None
        self.aggregator: Any = None
        if ranks.aggregate and self.enabled:
            from tbmem._internal.ranks.aggregate import RankAggregator

            self.aggregator = RankAggregator(rank=info.rank, world_size=info.world_size, keys=ranks.tags,
                                             write=self._write_values, store=lambda: self._store,
                                             timeout_s=ranks.timeout_s, instance=self.instance)

    @classmethod
    def create(cls, config: Any) -> "RankSupport | None":
        """The support for this process, or None for a single process or ``ranks.enabled=False``."""
        ranks = config.ranks if isinstance(config.ranks, RanksConfig) else RanksConfig()
        if not ranks.enabled:
            return None
        info = detect_rank()
        return cls(info, config) if info.distributed else None

    # --- construction ---------------------------------------------------------------------
    def run_dir(self, log_dir: str) -> str:
        """Where this rank's event files go: ``<log_dir>/rank<r>`` (or ``log_dir`` itself); in the
        compact layout a private folder for ranks above 0 (moved to ``<log_dir>/rank<r>`` at close
        if the rank matters: :mod:`tbmem._internal.ranks.compact`)."""
        if not self.config.subfolder:
            return log_dir
        final = self.info.run_dir(log_dir)
        if not self.compact or not self.enabled:
            return final
        from tbmem._internal.logdir.fs import is_url, join_url
        from tbmem._internal.ranks.compact import NodeChannel, PeakRanks, staging_folder

        remote = is_url(log_dir)  # s3://...: rank 0's run mirrored by the writer, the rest uploaded at close
        job = log_dir.rstrip("/") if remote else os.path.abspath(log_dir)
        local = self.info.local_rank if self.info.local_rank is not None else self.info.rank
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or self.info.world_size
        self._channel = NodeChannel(job, rank=self.info.rank, local_rank=local, local_world=local_world,
                                    instance=self.instance)
        if self.info.is_root:
            self._peaks = PeakRanks()
            return final
        staging = staging_folder(self.info.rank)
        name = f"rank{self.info.rank}"
        self._staging = (staging, join_url(job, name) if remote else os.path.join(job, name))
        return staging

    @property
    def staged(self) -> bool:
        """Whether this rank writes its run privately (compact layout, ranks above 0): nobody reads
        it before close, so its events need not reach the file one by one."""
        return self._staging is not None

    def table_sink(self) -> Callable[[int, Mapping[str, float]], None] | None:
        """``sink(step, values)`` sending a record to the node's rank table (compact layout), else None."""
        return self._send_to_table if self._channel is not None else None

    def _send_to_table(self, step: int, values: Mapping[str, float]) -> None:
        try:
            self._channel.send(step, values)
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            report_once("ranks:table", "tbmem: sending a record to the node's rank table failed; it is off", exc=exc)
            self._channel = None

    @property
    def writes_aggregates(self) -> bool:
        """Whether this rank writes the ``Ranks/...`` tags (rank 0, aggregation on)."""
        return self.info.is_root and self.aggregator is not None

    def snapshot_config(self, snapshot: Any) -> Any:
        """``snapshot`` with this rank in its file names, unless it names a rank itself."""
        if snapshot is not None and getattr(snapshot, "rank", 0) is None:
            return dataclasses.replace(snapshot, rank=self.info.rank)
        return snapshot

    def attach(self, *, write: Callable[[Mapping[str, float], int], None], snapshots: Callable[[], Any],
               flush: Callable[[], None]) -> None:
        """Connect the writer: how to write scalars, find its snapshot manager, flush."""
        self._write, self._snapshots, self._flush = write, snapshots, flush
        self._connect()

    def _connect(self) -> None:
        """Open the job store (once the process group exists) and start the out-of-memory watcher."""
        if self._store_tried or not self.enabled or not distributed_ready():
            return
        self._store_tried = True
        from tbmem._internal.ranks.store import JobStore

        store = JobStore.connect()
        if store is None:
            report_once("ranks:store", "tbmem: no MASTER_ADDR/MASTER_PORT: other ranks will not write "
                        "snapshots when one runs out of memory (see docs/distributed.md)")
            return
        try:
            self._oom = _subscribe(self, store)
        except Exception as exc:  # noqa: BLE001 - no store: no out-of-memory signal, timeouts only
            report_once("ranks:store", "tbmem: cannot reach the job's store (MASTER_ADDR/MASTER_PORT); other "
                        "ranks will not write snapshots when one runs out of memory", exc=exc)
            return
        self._store = store
        if self.aggregator is not None:
            self.aggregator.register()

    # --- hooks ------------------------------------------------------------------------------
    def on_log(self, step: int) -> None:
        """Every ``log_memory`` call (training thread): remember the step; write a peer's picture."""
        self.last_step = step
        if self._peer is not None:
            try:
                self._write_peer_picture()
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                report_once("ranks:peer-oom", "tbmem: could not write this rank's snapshot after another "
                            "rank's out-of-memory error", exc=exc)

    def on_record(self, step: int, readings: Mapping[str, float] | None) -> None:
        """Join the record's collective at steps divisible by ``every``; a no-op at other steps."""
        if self._closed or step % self.every != 0:
            return
        self._connect()
        if self.aggregator is not None:
            try:
                self.aggregator.record(step, readings)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                report_once("ranks:record", "tbmem: the cross-rank record failed; aggregates are off", exc=exc)
                self.aggregator.off = True

    def on_oom(self, step: int) -> None:
        """After this rank's own out-of-memory snapshot: tell the other ranks, wait for theirs."""
        self.keep.add("out of memory")
        if self._oom is None:
            return
        try:
            self._oom.signal(step)
        except Exception as exc:  # noqa: BLE001 - the OOM must reach the user, not this
            report_once("ranks:oom-signal", "tbmem: could not tell the other ranks about the out-of-memory "
                        "error", exc=exc)

    # --- a peer ran out of memory -------------------------------------------------------------
    def _on_peer_oom(self, oom_rank: int, oom_step: int, from_watcher: bool) -> None:
        logger.error("tbmem: rank %d ran out of memory at its step %d; rank %d writes its snapshot",
                     oom_rank, oom_step, self.info.rank)
        self._peer_done.clear()
        self._peer = (oom_rank, oom_step)
        if from_watcher and self._peer_done.wait(_HANDOFF_S):
            return  # the training thread reached log_memory and wrote it
        self._write_peer_picture()  # the training thread is blocked (in a collective with that rank)

    def _write_peer_picture(self) -> None:
        from tbmem._internal.ranks.oom import PeerOutOfMemoryError

        with self._lock:
            peer, self._peer = self._peer, None
            if peer is None or self._closed:
                return
            try:
                snapshots = self._snapshots()
                if snapshots is not None:
                    exc = PeerOutOfMemoryError(oom_rank=peer[0], oom_step=peer[1], rank=self.info.rank,
                                               step=self.last_step)
                    snapshots.on_oom(self.last_step, exc, stop_recording=False)
                    self.keep.add("a peer's out-of-memory error")
                self._flush()
            finally:
                self._peer_done.set()

    # --- writing and closing -------------------------------------------------------------------
    def _write_values(self, values: Mapping[str, float], step: int) -> None:
        if self._peaks is not None:
            self._peaks.see(values)
        if not self._closed:
            self._write(values, step)

    def close(self) -> None:
        """Collect the last gather, stop the watcher. Call before the event files close.

        Waits for an open gather at most ``min(timeout_s, 60 s)``; not at all while an exception
        is being handled (a crashing rank's peers may never reach the record it waits for).
        """
        if self._closed:
            return
        try:
            if self.aggregator is not None:
                unwinding = sys.exc_info()[0] is not None
                self.aggregator.close(limit_s=0.0 if unwinding else min(self.config.timeout_s, _CLOSE_WAIT_S))
            if self._peaks is not None and self._store is not None:  # after the last gather: every peak seen
                self._store.set(f"compact/{self.instance}/peaks", json.dumps(self._peaks.ranks()))
            if self._channel is not None:
                self._channel.close(wait_s=2.0 if sys.exc_info()[0] is not None else _CLOSE_WAIT_S)
            if self._oom is not None:
                _unsubscribe(self)
        except Exception as exc:  # noqa: BLE001
            report_once("ranks:close", "tbmem: closing the cross-rank support failed", exc=exc)
        finally:
            self._closed = True


    def finish(self, *, alerted: bool = False) -> str | None:
        """After the event files closed (compact layout, ranks above 0): move this rank's run into the
        job when it matters, else delete it. Returns the run's folder, or None when it was deleted."""
        if self._staging is None:
            return None
        staging, final = self._staging
        self._staging = None
        if alerted:
            self.keep.add("an alert")
        if not self.keep and self.info.rank in self._peak_ranks():
            self.keep.add("a peak of VRAM or RSS")
        try:
            if self.keep:
                from tbmem._internal.ranks.compact import move_run

                move_run(staging, final)
                logger.info("tbmem: rank %d keeps its run %s (%s)", self.info.rank, final, ", ".join(sorted(self.keep)))
                return final
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001
            report_once("ranks:finish", f"tbmem: could not move rank {self.info.rank}'s run from {staging} to {final}",
                        exc=exc)
        return None

    def _peak_ranks(self) -> list[int]:
        """The peak ranks rank 0 stored at its close (waits for them up to 10 s, not while unwinding)."""
        store = self._store
        if store is None:
            return []
        key = f"compact/{self.instance}/peaks"
        try:
            if sys.exc_info()[0] is None:
                store.wait([key], timeout_s=10.0)
            if not store.check([key]):
                return []
            return [int(r) for r in json.loads(store.get(key))]
        except Exception as exc:  # noqa: BLE001 - rank 0 gone or late: this run is not kept for a peak
            logger.debug("tbmem: no peak ranks from rank 0: %s", exc)
            return []


# --- one out-of-memory watcher per process, shared by its writers -------------------------------
_SUBSCRIBERS: list[RankSupport] = []
_SHARED: list[Any] = []  # [OomSignal] while a writer of this process is connected
_SUBSCRIBE_LOCK = threading.Lock()


def _fan_out(oom_rank: int, oom_step: int, from_watcher: bool) -> None:
    with _SUBSCRIBE_LOCK:
        supports = list(_SUBSCRIBERS)
    for support in supports:
        support._on_peer_oom(oom_rank, oom_step, from_watcher)


def _subscribe(support: RankSupport, store: Any) -> Any:
    from tbmem._internal.ranks.oom import OomSignal

    with _SUBSCRIBE_LOCK:
        if not _SHARED:
            _SHARED.append(OomSignal(store, rank=support.info.rank, world_size=support.info.world_size,
                                     on_peer_oom=_fan_out, wait_s=support.config.oom_wait_s))
        _SUBSCRIBERS.append(support)
        return _SHARED[0]


def _unsubscribe(support: RankSupport) -> None:
    with _SUBSCRIBE_LOCK:
        if support in _SUBSCRIBERS:
            _SUBSCRIBERS.remove(support)
        signal = _SHARED.pop() if _SHARED and not _SUBSCRIBERS else None
    if signal is not None:
        signal.close()
