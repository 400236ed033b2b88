"""The one place the console monitors write to.

Every monitor prints plain lines through :func:`emit`. Where a line goes is
decided at call time, in this order:

1. :func:`silence_output` / :func:`set_silent` switch every monitor off (nothing is written);
2. the monitor's own ``file=`` argument, when it was given one;
3. the module-wide target set by :func:`set_output` / :func:`redirect_output`;
4. ``sys.stdout`` as it is at the moment of the write (so pytest's ``capsys`` and
   ``contextlib.redirect_stdout`` see the lines).

A failing stream (closed file, broken pipe) is reported once on the ``tbmem``
logger and never raised into training.

Example:
    >>> import io
    >>> from tbmem._internal.monitor import MemoryMonitor, redirect_output
    >>> buffer = io.StringIO()
    >>> with redirect_output(buffer):
    ...     MemoryMonitor.print_memory_usage("demo")
    >>> buffer.getvalue().startswith("demo: CPU: ")
    True
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator, TextIO

from tbmem._internal._log import report_once
from tbmem._internal.monitor._checks import check_file

__all__ = ["emit", "set_output", "redirect_output", "set_silent", "silence_output"]

_lock = threading.Lock()
_target: TextIO | None = None
_silent = False


def emit(*lines: str, file: TextIO | None = None) -> None:
    """Write ``lines`` (each followed by a newline) to the current target; never raises."""
    if _silent or not lines:
        return
    stream = file if file is not None else (_target if _target is not None else sys.stdout)
    text = "\n".join(lines) + "\n"
    try:
        # One write call per group of lines, under a lock: lines of two threads
        # (SciPy's L-BFGS-B worker and the main thread) do not interleave mid-table.
        with _lock:
            stream.write(text)
    except (OSError, ValueError, AttributeError) as exc:
        report_once("monitor:output", "tbmem: a monitor could not write its console output", exc=exc)


def set_output(file: TextIO | None) -> TextIO | None:
    """Send the lines of every monitor without its own ``file=`` to ``file``
    (None: ``sys.stdout`` at call time). Returns the previous target."""
    global _target
    check_file(file)
    previous, _target = _target, file
    return previous


@contextmanager
def redirect_output(file: TextIO | None) -> Iterator[None]:
    """Temporarily :func:`set_output` to ``file``."""
    previous = set_output(file)
    try:
        yield
    finally:
        set_output(previous)


def set_silent(silent: bool = True) -> bool:
    """Silence (or un-silence) every monitor's console output; returns the previous setting."""
    global _silent
    previous, _silent = _silent, bool(silent)
    return previous


@contextmanager
def silence_output() -> Iterator[None]:
    """Temporarily silence every monitor (TensorBoard writing is unaffected)."""
    previous = set_silent(True)
    try:
        yield
    finally:
        set_silent(previous)
