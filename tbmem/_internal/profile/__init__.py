"""Profile windows: torch.profiler traces with tbmem's memory tracks inside (docs/profile.md).

:class:`ProfileConfig` says when (K steps every N) and what; :class:`tbmem.MemoryWriter` runs the
windows (``MemoryWriter(profile=...)``) through :mod:`tbmem._internal.profile.window` and writes each window's
trace (:mod:`tbmem._internal.profile.merge`) as ``plugins/tbmem/traces/step<s>/rank<r>.pt.trace.json.gz``.
Importing this package does not import torch.

Example:
    >>> from tbmem._internal.profile import ProfileConfig
    >>> ProfileConfig(every=100, steps=2).first_window(0)
    100
"""

from __future__ import annotations

from tbmem._internal.profile.config import ProfileConfig

__all__ = ["ProfileConfig"]
