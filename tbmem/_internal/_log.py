"""tbmem's logger, and "report once" for failures that must never reach training.

Failures inside monitoring are logged, not raised and not issued through
``warnings``: under ``-W error`` a warning would turn into an exception inside
the user's step (and inside a PhiFlow loss function, an exception hangs
SciPy's L-BFGS-B worker forever).

Example:
    >>> from tbmem._internal._log import report_once
    >>> report_once("demo", "the demo probe failed; it is switched off")
    True
    >>> report_once("demo", "again")
    False
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

__all__ = ["logger", "report_once", "forget_reports", "oom_line"]

logger = logging.getLogger("tbmem")

_reported: set[str] = set()
_lock = threading.Lock()


def report_once(key: str, message: str, *, exc: BaseException | None = None) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen; return whether it was logged."""
    with _lock:
        if key in _reported:
            return False
        _reported.add(key)
    logger.warning("%s%s", message, f" ({type(exc).__name__}: {exc})" if exc is not None else "")
    return True


def forget_reports() -> None:
    """Forget which keys were reported (for tests and long-lived processes)."""
    with _lock:
        _reported.clear()


def oom_line(step: int, exc: BaseException, paths: Sequence[str], snapshot_error: str | None) -> str:
    """The one line that reports an out-of-memory error and what became of its snapshot.

    Example:
        >>> oom_line(7, MemoryError("2 GiB"), ["a.json.gz"], "html not written")
        'tbmem: out of memory at step 7 (MemoryError: 2 GiB); snapshot saved to a.json.gz (html not written)'
    """
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    line = f"tbmem: out of memory at step {step} ({type(exc).__name__}: {first})"
    if paths:
        line += "; snapshot saved to " + ", ".join(paths)
        if snapshot_error:
            line += f" ({snapshot_error})"
    elif snapshot_error:
        line += f"; the snapshot could not be written ({snapshot_error})"
    return line
