"""tbmem's own connection to the job's store (the TCPStore server behind the process group).

Under ``torchrun`` (and any ``env://`` rendezvous) the process group's store server listens
at ``MASTER_ADDR:MASTER_PORT``. tbmem opens a client connection of its own there, so it can
block in ``wait`` (the out-of-memory watcher) without holding the lock of the client
torch.distributed uses. Keys live under ``tbmem/<run id>/<restart>/``, so an elastic
restart does not see the previous attempt's keys. Without ``MASTER_ADDR``/``MASTER_PORT``
(``tcp://`` or ``file://`` init methods) there is no store: the out-of-memory signal is
off and out-of-step ranks fall back to ``timeout_s``.

Example:
    >>> from tbmem.ranks.store import JobStore
    >>> JobStore.connect(environ={}) is None  # no MASTER_ADDR/MASTER_PORT: no store
    True
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Iterable, Mapping

__all__ = ["JobStore", "StoreTimeout"]


class StoreTimeout(Exception):
    """A ``wait`` on the store ran out of time."""


class JobStore:
    """Namespaced access to the job's store through a connection of tbmem's own.

    Args:
        store: A ``torch.distributed.Store`` (a TCPStore client).
        prefix: Key prefix of this job attempt.
    """

    def __init__(self, store: Any, prefix: str) -> None:
        self._store = store
        self.prefix = prefix
        self._endpoint: tuple[str, int, float] | None = None

    @classmethod
    def connect(cls, *, environ: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> "JobStore | None":
        """A client of the store at ``MASTER_ADDR:MASTER_PORT``, or None when there is none to reach."""
        env = os.environ if environ is None else environ
        host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
        if not host or not port.isdigit():
            return None
        import torch.distributed as dist

        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        run = env.get("TORCHELASTIC_RUN_ID", "job")
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        job = cls(store, f"tbmem/{run}/{restart}/")
        job._endpoint = (host, int(port), timeout_s)
        return job

    def clone(self) -> "JobStore":
        """Another connection to the same store and keys: a client serialises its operations, so
        a thread blocked in :meth:`wait` needs a connection of its own."""
        if self._endpoint is None:
            raise RuntimeError("this JobStore was not opened by JobStore.connect")
        import torch.distributed as dist

        host, port, timeout_s = self._endpoint
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        job = JobStore(store, self.prefix)
        job._endpoint = self._endpoint
        return job

    def _k(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``."""
        self._store.set(self._k(key), value)

    def get(self, key: str) -> str:
        """The value of ``key`` (blocks until it exists, up to the connection's timeout)."""
        return bytes(self._store.get(self._k(key))).decode("utf-8")

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key``; return the new value (0 reads it)."""
        return int(self._store.add(self._k(key), amount))

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key exists, without waiting."""
        return bool(self._store.check([self._k(k) for k in keys]))

    def first(self, key: str, value: str) -> str:
        """Set ``key`` to ``value`` unless it is set; return the value it holds (first writer wins)."""
        held = self._store.compare_set(self._k(key), "", value)
        return bytes(held).decode("utf-8")

    def wait(self, keys: Iterable[str], timeout_s: float) -> None:
        """Block until every key exists.

        Raises:
            StoreTimeout: ``timeout_s`` passed first.
            RuntimeError: the store cannot be reached (the job is ending).
        """
        try:
            self._store.wait([self._k(k) for k in keys], timedelta(seconds=timeout_s))
        except Exception as exc:  # torch raises DistStoreError for a timeout, DistNetworkError else
            if "timeout" in str(exc).lower() and "network" not in type(exc).__name__.lower():
                raise StoreTimeout(str(exc)) from exc
            raise
