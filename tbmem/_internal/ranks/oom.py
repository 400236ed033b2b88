"""Out-of-memory on one rank, pictures from every rank: signalled through the job's store.

The rank that runs out of memory writes its own snapshot first (nothing else happens
before it), then :meth:`OomSignal.signal` numbers the event (``oom/count``), stores
``"<rank>:<step>"`` under ``oom/<n>``, counts its own picture (``oom/<n>/pics``) and wakes
every rank's watcher (``wake/<r>/<n>``). No collective is involved: the other ranks may be
stuck in a collective that the failed rank will never join.

Each process with a tbmem writer runs one daemon thread blocked in ``wait`` on its own wake
key, on a store connection of its own (a client serialises its operations); ``oom/watchers``
counts them. Woken, it hands the event to its writers: the training thread writes this
rank's snapshot at its next ``log_memory`` call if it comes within a second; if it does not
(the thread is blocked in a collective with the failed rank), the watcher writes it itself.
Then it adds one to ``oom/<n>/pics``. The failed rank waits up to ``oom_wait_s`` until every
watcher counted its picture before its error goes on to the user, because once its process
exits, torchrun stops the others within a tenth of a second.

Example:
    >>> from tbmem._internal.ranks.oom import PeerOutOfMemoryError
    >>> str(PeerOutOfMemoryError(oom_rank=1, oom_step=7, rank=0, step=9))
    'rank 1 ran out of memory at its step 7; this is rank 0 at its step 9 (signalled through the job store)'
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from tbmem._internal._log import logger, report_once
from tbmem._internal.ranks.store import JobStore, StoreTimeout

__all__ = ["OomSignal", "PeerOutOfMemoryError"]

_FOREVER_S = 30 * 24 * 3600.0  # the watcher's wait: woken by a key, never by a timeout (torch logs those)
_CLOSE = "close"


class PeerOutOfMemoryError(RuntimeError):
    """Names, in a snapshot's ``exception`` field, the rank that ran out of memory."""

    def __init__(self, *, oom_rank: int, oom_step: int, rank: int, step: int) -> None:
        super().__init__(f"rank {oom_rank} ran out of memory at its step {oom_step}; this is rank {rank} at "
                         f"its step {step} (signalled through the job store)")
        self.oom_rank, self.oom_step = oom_rank, oom_step


class OomSignal:
    """Signals this rank's out-of-memory error and watches for the other ranks'.

    Args:
        store: The job's store (tbmem's own connection).
        rank: This rank.
        world_size: Ranks in the job.
        on_peer_oom: Called as ``on_peer_oom(oom_rank, oom_step, from_watcher)`` to write this
            rank's picture; returns when it is written.
        wait_s: How long :meth:`signal` waits for the other ranks' pictures.
    """

    def __init__(self, store: JobStore, *, rank: int, world_size: int,
                 on_peer_oom: Callable[[int, int, bool], None], wait_s: float) -> None:
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.on_peer_oom = on_peer_oom
        self.wait_s = wait_s
        self._watch_store = store.clone()  # blocks in wait: a connection of its own
        self._watch_store.add("oom/watchers", 1)  # connects now: a store out of reach fails here
        self._next = 1  # the next event number the watcher waits for
        self._own: set[int] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"tbmem-oom-watch-rank{rank}", daemon=True)
        self._thread.start()

    # --- the failed rank --------------------------------------------------------------------
    def signal(self, step: int) -> None:
        """Tell every rank that this one ran out of memory at ``step``; wait for their pictures."""
        store = self.store
        n = store.add("oom/count", 1)
        self._own.add(n)
        store.set(f"oom/{n}", f"{self.rank}:{step}")
        store.add(f"oom/{n}/pics", 1)  # this rank's own snapshot is written already
        for r in range(self.world_size):  # first writer wins: a watcher closed meanwhile stays closed
            store.first(f"wake/{r}/{n}", str(n))
        logger.error("tbmem: rank %d told the other ranks through the job store; they write their "
                     "snapshots now", self.rank)
        deadline = time.monotonic() + self.wait_s
        while True:
            pics, watchers = store.add(f"oom/{n}/pics", 0), store.add("oom/watchers", 0)
            if pics >= watchers:
                return
            if time.monotonic() >= deadline:
                logger.error("tbmem: %d of the %d ranks with a tbmem writer confirmed their snapshots within "
                             "%.0f s (oom_wait_s); going on", pics, watchers, self.wait_s)
                return
            time.sleep(0.02)

    # --- every rank ---------------------------------------------------------------------------
    def _watch(self) -> None:
        store = self._watch_store
        while not self._stopped.is_set():
            n = self._next
            try:
                store.wait([f"wake/{self.rank}/{n}"], _FOREVER_S)
                if store.get(f"wake/{self.rank}/{n}") == _CLOSE:
                    return
                oom_rank, _, oom_step = store.get(f"oom/{n}").partition(":")
            except StoreTimeout:
                continue
            except Exception as exc:  # noqa: BLE001 - the store went away: the job is ending
                logger.debug("tbmem: the out-of-memory watcher stops: %s", exc)
                return
            self._next = n + 1
            if self._stopped.is_set():
                return
            if n in self._own or int(oom_rank) == self.rank:
                continue
            try:
                self.on_peer_oom(int(oom_rank), int(oom_step), True)
            except Exception as exc:  # noqa: BLE001 - a thread must not die with a traceback on stderr
                report_once("ranks:peer-oom", "tbmem: could not write this rank's snapshot after another "
                            "rank's out-of-memory error", exc=exc)
            try:
                store.add(f"oom/{n}/pics", 1)
            except Exception as exc:  # noqa: BLE001
                logger.debug("tbmem: could not confirm the snapshot: %s", exc)
                return

    def close(self) -> None:
        """Stop the watcher (wakes it through its own key) and stop counting it."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self.store.add("oom/watchers", -1)
            self.store.first(f"wake/{self.rank}/{self._next}", _CLOSE)
        except Exception as exc:  # noqa: BLE001 - the store is gone: so is the watcher's wait
            logger.debug("tbmem: could not wake the out-of-memory watcher: %s", exc)
        self._thread.join(timeout=5.0)
