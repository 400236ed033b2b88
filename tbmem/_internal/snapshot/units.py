"""Byte counts as people read them (binary units), shared by the snapshot summaries and tbmem._internal.oom.

Example:
    >>> format_bytes(1536), format_bytes(3 * 2**30)
    ('1.5 KiB', '3.0 GiB')
"""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """Human-readable binary size (``1.5 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
