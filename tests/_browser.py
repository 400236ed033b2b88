"""Waiting on a page's state without Playwright's ``wait_for_function``.

``wait_for_function`` polls by compiling its predicate with ``eval`` inside the page, which a
Content-Security-Policy without ``'unsafe-eval'`` (the snapshot viewer's, the Memory tab's) refuses
whenever the predicate is not already true at the first check. ``evaluate`` runs through the
DevTools protocol, which the page's policy does not govern.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["wait_until"]


def wait_until(target: Any, expression: str, *, timeout_s: float = 60.0, interval_s: float = 0.05) -> Any:
    """Poll ``target.evaluate(expression)`` (a page or a frame) until it is truthy; return that value.

    Raises:
        TimeoutError: still falsy after ``timeout_s``, with the last value in the message.
    """
    deadline = time.monotonic() + timeout_s
    value: Any = None
    while True:
        try:
            value = target.evaluate(expression)
        except Exception as exc:  # noqa: BLE001 - a navigation in progress: look again
            value = exc
        if value and not isinstance(value, Exception):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still not true after {timeout_s} s (last: {value!r})")
        time.sleep(interval_s)
