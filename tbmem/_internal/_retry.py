"""Retry with exponential backoff, for failures that may be transient (an EIO, a full disk).

A :class:`Backoff` answers two questions for one failing component: may it try
again now (:meth:`Backoff.ready`), and has it failed often enough in a row to be
switched off (:attr:`Backoff.exhausted`). It never sleeps: callers skip their work
until the next attempt is due, so training never waits for monitoring.

Example:
    >>> from tbmem._internal._retry import Backoff
    >>> now = [0.0]
    >>> b = Backoff(base_s=1.0, cap_s=4.0, max_failures=3, clock=lambda: now[0])
    >>> b.failed(), b.ready(), b.exhausted
    (1, False, False)
    >>> now[0] = 1.0; b.ready()
    True
    >>> b.failed(), b.failed(), b.exhausted
    (2, 3, True)
    >>> b.succeeded(); b.failures, b.ready()
    (0, True)
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Backoff"]


def _now() -> float:
    return time.monotonic()


class Backoff:
    """Consecutive failures of one component and when it may try again.

    Args:
        base_s: Wait after the first failure; each further failure in a row doubles it.
        cap_s: Longest wait.
        max_failures: Failures in a row after which :attr:`exhausted` is True
            (0: never; the caller keeps retrying every ``cap_s`` at most).
        clock: Monotonic seconds; None reads :func:`time.monotonic` (through ``_now``,
            which tests replace).
        at_once: Failures in a row retried at the next attempt, without a wait (1: a single
            transient error costs one attempt, not every attempt of the next ``base_s``).
    """

    def __init__(self, *, base_s: float = 1.0, cap_s: float = 60.0, max_failures: int = 0,
                 clock: Callable[[], float] | None = None, at_once: int = 0) -> None:
        if base_s < 0 or cap_s < base_s:
            raise ValueError(f"Backoff needs 0 <= base_s <= cap_s, got base_s={base_s}, cap_s={cap_s}")
        if at_once < 0:
            raise ValueError(f"Backoff needs at_once >= 0, got {at_once}")
        self.at_once = at_once
        self.base_s = base_s
        self.cap_s = cap_s
        self.max_failures = max_failures
        self.clock = clock
        self.failures = 0
        self.total_failures = 0
        self._next = 0.0

    def _time(self) -> float:
        return self.clock() if self.clock is not None else _now()

    def ready(self) -> bool:
        """Whether the next attempt is due (always True before the first failure)."""
        return self.failures == 0 or self._time() >= self._next

    @property
    def exhausted(self) -> bool:
        """True after ``max_failures`` failures in a row."""
        return 0 < self.max_failures <= self.failures

    @property
    def wait_s(self) -> float:
        """The wait scheduled after the latest failure (0 before any)."""
        if self.failures <= self.at_once:
            return 0.0
        return min(self.cap_s, self.base_s * 2 ** (self.failures - 1 - self.at_once))

    def failed(self) -> int:
        """Count a failure, schedule the next attempt; return the failures in a row."""
        self.failures += 1
        self.total_failures += 1
        self._next = self._time() + self.wait_s
        return self.failures

    def succeeded(self) -> None:
        """Reset the run of failures: the next failure waits ``base_s`` again."""
        self.failures = 0
        self._next = 0.0
