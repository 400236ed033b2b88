"""Out-of-memory on one rank, pictures from every rank: signalled through the job's store.

The rank that runs out of memory writes its own snapshot first (nothing else happens
before it), then :meth:`OomSignal.signal` numbers the event (``oom/count``), stores
``"<rank>:<step>"`` under ``oom/<n>`` and wakes every rank's watcher (``wake/<r>/<n>``).
No collective is involved: the other ranks may be stuck in a collective that the failed
rank will never join.

Each rank runs one daemon thread blocked in ``wait`` on its own wake key, on a store
connection of its own (a client serialises its operations). Woken, it hands the event to
its writer: the training thread writes this rank's snapshot at its next ``log_memory``
call if it comes within a second; if it does not (the thread is blocked in a collective
with the failed rank), the watcher writes it itself. Then it marks ``pic/<n>/<rank>``. The failed rank waits up to
``oom_wait_s`` for every rank's mark before its error goes on to the user, because once
its process exits, torchrun stops the others within a tenth of a second.

Example:
    >>> from tbmem.ranks.oom import PeerOutOfMemoryError
    >>> str(PeerOutOfMemoryError(oom_rank=1, oom_step=7, rank=0, step=9))
    'rank 1 ran out of memory at its step 7; this is rank 0 at its step 9 (signalled through the job store)'
"""

from __future__ import annotations

import threading
from typing import Callable

from tbmem._log import logger, report_once
from tbmem.ranks.store import JobStore, StoreTimeout

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
        self._watch_store.check(["oom/count"])  # connect now: a store out of reach fails here, not later
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
        store.set(f"pic/{n}/{self.rank}", "own")
        for r in range(self.world_size):  # first writer wins: a watcher closed meanwhile stays closed
            store.first(f"wake/{r}/{n}", str(n))
        logger.error("tbmem: rank %d told the other %d ranks through the job store; they write their "
                     "snapshots now", self.rank, self.world_size - 1)
        if self.wait_s <= 0:
            return
        others = [f"pic/{n}/{r}" for r in range(self.world_size) if r != self.rank]
        try:
            store.wait(others, self.wait_s)
        except StoreTimeout:
            missing = [r for r in range(self.world_size) if r != self.rank and not store.check([f"pic/{n}/{r}"])]
            logger.error("tbmem: ranks %s did not confirm their snapshots within %.0f s (oom_wait_s); going "
                         "on", _ranges(missing), self.wait_s)

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
                store.set(f"pic/{n}/{self.rank}", "peer")
            except Exception as exc:  # noqa: BLE001
                logger.debug("tbmem: could not confirm the snapshot: %s", exc)
                return

    def close(self) -> None:
        """Stop the watcher (wakes it through its own key)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self.store.first(f"wake/{self.rank}/{self._next}", _CLOSE)
        except Exception as exc:  # noqa: BLE001 - the store is gone: so is the watcher's wait
            logger.debug("tbmem: could not wake the out-of-memory watcher: %s", exc)
        self._thread.join(timeout=5.0)


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2, 5'``: 1,000 ranks do not fit in a log line one by one."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
