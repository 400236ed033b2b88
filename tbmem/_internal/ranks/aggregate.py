"""Cross-rank aggregates: one gather per record over a gloo group of tbmem's own.

At every step divisible by ``every`` each rank sends one small float64 vector,
``[step, reading_1, ..., reading_K]`` (NaN where it has no value: a probe that failed,
no CUDA), to rank 0 with one ``gather`` on a gloo process group created for tbmem. Rank 0
writes ``Ranks/<tag>/max|min|mean|argmax`` and ``Ranks/reporting``.

The gather is asynchronous: each rank launches it and goes on training; the result is
collected at the next record (or at close) and written with the step it belongs to.
Nothing here waits unless a record's gather is still open one record later.

Whether a rank joins is decided by the step number alone (``step % every == 0``), never by
local state: a rank whose probes failed joins with NaN. When ranks are out of step anyway
(they called ``log_memory`` with different steps, or one stopped calling it), the
collective cannot complete: a rank waits at most ``timeout_s``, less when the job store
says another rank gave up or closed its writer, then switches aggregation off (reported
once) and goes on. A gather that pairs different steps is detected on rank 0 (the step is
in the vector): no aggregate is written from it and aggregation is switched off everywhere.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.ranks.aggregate import aggregate_rows
    >>> rows = np.array([[10, 1.0 * 2**30], [10, 3.0 * 2**30], [10, np.nan]])
    >>> values, reporting = aggregate_rows(rows, ("ram_rss",))
    >>> values["Ranks/Memory/RAM/process_rss_GB/argmax"], values["Ranks/Memory/RAM/process_rss_GB/mean"]
    (1.0, 2.0)
    >>> reporting
    2
"""

from __future__ import annotations

import functools
import math
import time
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tbmem._internal._log import logger, report_once
from tbmem._internal.ranks.store import JobStore
from tbmem._internal.tags import TAGS, ranks_tag

__all__ = ["RankAggregator", "aggregate_rows"]

_CLOSED_GRACE_S = 10.0  # after a rank closed its writer, how long an open gather may still complete
_STORE_POLL_S = 0.5
_REGISTER_WAIT_S = 10.0  # how long the first rank at the first record waits for the others' writers


def aggregate_rows(rows: np.ndarray, keys: Sequence[str]) -> tuple[dict[str, float], int]:
    """The ``Ranks/...`` scalars of one record from its gathered rows (rank r's vector in row r).

    Args:
        rows: ``[world_size, 1 + len(keys)]``: the step, then the raw readings (NaN: none).
        keys: The readings' keys, in vector order.

    Returns:
        ``({tag: value}, ranks that sent at least one value)``; a reading no rank has is left out.
    """
    data = rows[:, 1:]
    present = ~np.isnan(data)
    has = present.any(axis=0)
    values: dict[str, float] = {}
    if has.any():
        scale = _scales(tuple(keys))
        filled = np.where(present, data, -np.inf)
        top = filled.argmax(axis=0)  # the first maximal rank: the lowest on a tie
        count = np.maximum(present.sum(axis=0), 1)
        mean = np.where(present, data, 0.0).sum(axis=0) / count
        low = np.where(present, data, np.inf).min(axis=0)
        # whole columns at once, then plain floats: indexing numpy scalars key by key cost rank 0
        # about 3 us per reading at every record
        high_l = (filled[top, np.arange(data.shape[1])] / scale).tolist()
        low_l, mean_l, top_l = (low / scale).tolist(), (mean / scale).tolist(), top.tolist()
        for j in np.flatnonzero(has).tolist():
            names = _stat_tags(keys[j])
            values[names[0]] = high_l[j]
            values[names[1]] = low_l[j]
            values[names[2]] = mean_l[j]
            values[names[3]] = float(top_l[j])
    return values, int(present.any(axis=1).sum())


@functools.lru_cache(maxsize=None)
def _scales(keys: tuple[str, ...]) -> np.ndarray:
    return np.array([TAGS[k].scale for k in keys])


@functools.lru_cache(maxsize=None)
def _stat_tags(key: str) -> tuple[str, str, str, str]:
    tag = TAGS[key].tag
    return ranks_tag("max", tag), ranks_tag("min", tag), ranks_tag("mean", tag), ranks_tag("argmax", tag)


class _Open:
    """One launched gather and the buffers it owns until it completes."""

    def __init__(self, step: int, send: Any, receive: Any, work: Any) -> None:
        self.step, self.send, self.receive, self.work = step, send, receive, work
        self.started = time.monotonic()


class RankAggregator:
    """Gathers each record's readings to rank 0 and writes their aggregates there.

    Args:
        rank: This rank. world_size: Ranks in the job.
        keys: Readings aggregated (keys of :data:`tbmem.TAGS`).
        write: ``write(values, step)`` writes scalars as one event (rank 0 only).
        store: The job's store, for giving up early when ranks are out of step (may be None).
        timeout_s: Longest wait for an open gather.
        instance: This writer's number in its process (the same on every rank of an SPMD script).
    """

    def __init__(self, *, rank: int, world_size: int, keys: Sequence[str],
                 write: Callable[[Mapping[str, float], int], None], store: Callable[[], JobStore | None],
                 timeout_s: float, instance: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self._ns = f"ranks/{instance}/"  # this writer's keys in the job store
        self._registered = False
        self.keys = tuple(keys)
        self._write = write
        self._store = store
        self.timeout_s = timeout_s
        self.off = False
        self.records = 0  # gathers completed
        self._group: Any = None
        self._open: _Open | None = None
        self._abandoned: list[_Open] = []  # gloo may still touch their buffers: keep them alive
        self._send: Any = None
        self._send_np: Any = None
        self._rows: Any = None
        self._receive: list[Any] | None = None

    # --- the record ---------------------------------------------------------------------
    def record(self, step: int, readings: Mapping[str, float] | None) -> None:
        """Join this record's gather (call at every step divisible by ``every``, on every rank)."""
        if self.off:
            return
        self._finish(wait=True)
        if self.off or not self._ensure_group():
            return
        import torch.distributed as dist

        send, rows, receive = self._buffers()
        vector = self._send_np
        vector[0] = step
        vector[1:] = [readings.get(key, math.nan) for key in self.keys] if readings else math.nan
        try:
            work = dist.gather(send, receive, dst=0, group=self._group, async_op=True)
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            self._switch_off("the cross-rank gather could not start", exc)
            return
        self._open = _Open(step, send, rows, work)

    def _buffers(self) -> tuple[Any, Any, list[Any] | None]:
        """The send vector and rank 0's ``[world, 1 + K]`` receive rows, reused from record to record
        (the previous gather has completed when the next one starts)."""
        if self._send is None:
            import torch

            self._send = torch.empty(1 + len(self.keys), dtype=torch.float64)
            self._send_np = self._send.numpy()  # the same memory, filled in place at each record
            if self.rank == 0:
                self._rows = torch.empty(self.world_size, 1 + len(self.keys), dtype=torch.float64)
                self._receive = list(self._rows.unbind(0))
        return self._send, self._rows, self._receive

    def _ensure_group(self) -> bool:
        if self._group is not None:
            return True
        from tbmem._internal.ranks.context import distributed_ready

        if not distributed_ready():
            return False  # every rank sees the same: init_process_group is itself collective
        import torch.distributed as dist

        store = self._store()
        if store is not None:  # every rank of the default group must create the group, or it hangs
            try:
                ranks_with_writer = self._agree(store)
            except Exception as exc:  # noqa: BLE001
                self._switch_off("the job store did not answer before the first cross-rank record", exc)
                return False
            if ranks_with_writer < self.world_size:
                self.off = True
                report_once("ranks:writers", f"tbmem: only {ranks_with_writer} of the {self.world_size} ranks "
                            "had a tbmem writer at the first record (a writer on rank 0 only?): cross-rank "
                            "aggregates are off; each rank with a writer still writes its own run")
                return False
        try:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        except Exception as exc:  # noqa: BLE001
            self._switch_off("could not create tbmem's gloo group for the cross-rank aggregates", exc)
            return False
        return True

    def register(self) -> None:
        """Count this rank's writer in the job store (once): the first record needs all of them."""
        store = self._store()
        if store is not None and not self._registered:
            store.add(self._ns + "registered", 1)
            self._registered = True

    def _agree(self, store: JobStore) -> int:
        """How many ranks have this writer, as every rank will read it: the first rank to ask waits
        up to ``_REGISTER_WAIT_S`` for all of them and stores what it saw (first writer wins)."""
        self.register()
        deadline = time.monotonic() + min(self.timeout_s, _REGISTER_WAIT_S)
        count = store.add(self._ns + "registered", 0)
        while count < self.world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            count = store.add(self._ns + "registered", 0)
        return int(store.first(self._ns + "writers", str(count)))

    def _finish(self, *, wait: bool, limit_s: float | None = None) -> None:
        """Collect the open gather; rank 0 writes its aggregates. Waits only if it is still open."""
        op = self._open
        if op is None:
            return
        if not op.work.is_completed():
            if not wait:
                return
            why = self._wait(op, self.timeout_s if limit_s is None else limit_s)
            if why is not None:
                self._abandoned.append(op)
                self._open = None
                self._switch_off(f"the cross-rank gather of step {op.step} did not complete: {why}")
                return
        self._open = None
        try:
            op.work.wait()
        except Exception as exc:  # noqa: BLE001 - a rank died or the group failed
            self._switch_off(f"the cross-rank gather of step {op.step} failed{self._closed_hint()}", exc)
            return
        self.records += 1
        if op.receive is not None:
            self._write_aggregates(op)

    def _wait(self, op: _Open, limit_s: float) -> str | None:
        """Wait for ``op``; None when it completed, else why it was given up."""
        deadline = time.monotonic() + limit_s
        closed_since: float | None = None
        next_poll = time.monotonic() + _STORE_POLL_S
        pause = 50e-6
        while not op.work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                return (f"no answer within {limit_s:.0f} s (timeout_s): the ranks called log_memory with "
                        "different steps, or one stopped calling it")
            if now >= next_poll:
                next_poll = now + _STORE_POLL_S
                store = self._store()
                if store is not None:
                    try:
                        if store.check([self._ns + "off"]):
                            return "another rank switched the cross-rank aggregates off"
                        if closed_since is None and store.add(self._ns + "closed", 0) > 0:
                            closed_since = now
                    except Exception as exc:  # noqa: BLE001 - the store is gone: rely on the timeout
                        logger.debug("tbmem: job store unreachable: %s", exc)
                if closed_since is not None and now - closed_since > _CLOSED_GRACE_S:
                    return ("a rank closed its writer without joining it: the ranks called log_memory with "
                            "different steps")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return None

    def _write_aggregates(self, op: _Open) -> None:
        rows = op.receive.numpy()
        steps = rows[:, 0]
        if not (steps == op.step).all():
            odd = {int(r): int(s) for r, s in enumerate(steps) if s != op.step}
            self._switch_off(f"ranks called log_memory with different steps: rank 0 at step {op.step}, "
                             f"{_few(odd)}; no aggregate is written from this record")
            return
        values, reporting = aggregate_rows(rows, self.keys)
        values[TAGS["ranks_reporting"].tag] = float(reporting)
        self._write(values, op.step)

    def _closed_hint(self) -> str:
        store = self._store()
        try:
            closed = store.add(self._ns + "closed", 0) if store is not None else 0
        except Exception:  # noqa: BLE001 - only a hint
            closed = 0
        if closed:
            return (f" ({closed} rank(s) had closed their writers already: the ranks called log_memory with "
                    "different steps)")
        return ""

    def _switch_off(self, message: str, exc: BaseException | None = None) -> None:
        self.off = True
        report_once("ranks:aggregate", f"tbmem: {message}; cross-rank aggregates are switched off on rank "
                    f"{self.rank}, training goes on", exc=exc)
        store = self._store()
        if store is not None:
            try:
                store.set(self._ns + "off", str(self.rank))
            except Exception as err:  # noqa: BLE001
                logger.debug("tbmem: could not tell the other ranks: %s", err)

    def close(self, limit_s: float | None = None) -> None:
        """Collect the last gather (waiting at most ``limit_s``, default ``timeout_s``) and tell the
        others this rank is done."""
        if not self.off:
            if limit_s is not None and limit_s <= 0:
                self._finish(wait=False)  # written if it completed; else left to gloo's timeout
            else:
                self._finish(wait=True, limit_s=limit_s)
        store = self._store()
        if store is not None:
            try:
                store.add(self._ns + "closed", 1)
            except Exception as exc:  # noqa: BLE001
                logger.debug("tbmem: could not mark this rank closed: %s", exc)


def _few(mapping: Mapping[int, int], limit: int = 5) -> str:
    items = [f"rank {r} at step {s}" for r, s in list(mapping.items())[:limit]]
    more = len(mapping) - limit
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")
