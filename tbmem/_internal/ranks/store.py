"""tbmem's own connection to the job's store (the TCPStore server behind the process group).

Under ``torchrun`` (and any ``env://`` rendezvous) the process group's store server listens
at ``MASTER_ADDR:MASTER_PORT``. tbmem opens a client connection of its own there, so it can
block in ``wait`` (the out-of-memory watcher) without holding the lock of the client
torch.distributed uses. Keys live under ``tbmem/<run id>/<restart>/``, so an elastic
restart does not see the previous attempt's keys. Without ``MASTER_ADDR``/``MASTER_PORT``
(``tcp://`` or ``file://`` init methods) there is no store: the out-of-memory signal is
off and out-of-step ranks fall back to ``timeout_s``.

Example:
    >>> from tbmem._internal.ranks.store import JobStore
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

    The connection opens on first use: a job whose ranks never need the store (no rank out of
    step, no out-of-memory error) holds only the watchers' connections.

    Args:
        endpoint: ``(host, port, timeout_s)`` of the store server.
        prefix: Key prefix of this job attempt.
    """

    def __init__(self, endpoint: tuple[str, int, float], prefix: str) -> None:
        self.endpoint = endpoint
        self.prefix = prefix
        self._client: Any = None

    @classmethod
    def connect(cls, *, environ: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> "JobStore | None":
        """The store at ``MASTER_ADDR:MASTER_PORT`` (connected on first use), or None without one."""
        env = os.environ if environ is None else environ
        host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
        if not host or not port.isdigit():
            return None
        run = env.get("TORCHELASTIC_RUN_ID", "job")
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        return cls((host, int(port), timeout_s), f"tbmem/{run}/{restart}/")

    def clone(self) -> "JobStore":
        """Another connection to the same store and keys: a client serialises its operations, so
        a thread blocked in :meth:`wait` needs a connection of its own."""
        return JobStore(self.endpoint, self.prefix)

    @property
    def _store(self) -> Any:
        if self._client is None:
            import torch.distributed as dist

            host, port, timeout_s = self.endpoint
            self._client = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                         timeout=timedelta(seconds=timeout_s))
        return self._client

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
