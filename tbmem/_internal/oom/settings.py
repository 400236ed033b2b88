"""The caching allocator's settings in force: from a snapshot's ``allocator_settings``, or from the environment.

A snapshot of torch >= 2.5 records them (``PYTORCH_CUDA_ALLOC_CONF`` as given, and the values the
allocator parsed: ``expandable_segments``, ``max_split_size`` in bytes, -1 unset,
``garbage_collection_threshold``); a running process has ``PYTORCH_CUDA_ALLOC_CONF`` (or
``PYTORCH_ALLOC_CONF``, torch >= 2.9) in its environment. What the allocator parsed wins over the string.

Example:
    >>> s = AllocatorSettings.from_conf("expandable_segments:True,max_split_size_mb:512")
    >>> s.expandable_segments, s.max_split_size_mb, s.garbage_collection_threshold
    (True, 512, None)
    >>> AllocatorSettings.from_mapping({"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False,
    ...                                 "max_split_size": -1}).to_json()["expandable_segments"]
    False
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_NAMES", "AllocatorSettings"]

#: The environment variables torch reads its allocator configuration from (the first set wins).
ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass(frozen=True)
class AllocatorSettings:
    """What the caching allocator was configured with (None: not known or not set)."""

    conf: str | None = None
    expandable_segments: bool | None = None
    max_split_size_mb: int | None = None
    garbage_collection_threshold: float | None = None
    source: str = "unknown"

    @classmethod
    def from_conf(cls, conf: str | None, *, source: str = "environment") -> AllocatorSettings:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string (``key:value`` pairs separated by commas)."""
        values: dict[str, str] = {}
        for part in (conf or "").split(","):
            key, _, value = part.partition(":")
            if key.strip():
                values[key.strip()] = value.strip()
        exp = values.get("expandable_segments")
        split = values.get("max_split_size_mb")
        gc = values.get("garbage_collection_threshold")
        return cls(conf=conf, expandable_segments=None if exp is None else exp.lower() == "true",
                   max_split_size_mb=int(split) if split and split.isdigit() else None,
                   garbage_collection_threshold=_float(gc), source=source)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> AllocatorSettings:
        """The settings a process started with (expandable segments off unless the variable says so)."""
        env = os.environ if environ is None else environ
        conf = next((env[n] for n in ENV_NAMES if env.get(n)), "")
        s = cls.from_conf(conf, source="environment")
        return cls(conf=conf, expandable_segments=bool(s.expandable_segments), max_split_size_mb=s.max_split_size_mb,
                   garbage_collection_threshold=s.garbage_collection_threshold or 0.0, source="environment")

    @classmethod
    def from_mapping(cls, recorded: Mapping[str, Any] | None) -> AllocatorSettings:
        """From a snapshot's ``allocator_settings`` (None or empty: nothing known)."""
        if not recorded:
            return cls()
        conf = recorded.get("PYTORCH_CUDA_ALLOC_CONF")
        s = cls.from_conf(conf if isinstance(conf, str) else None, source="snapshot")
        exp = recorded.get("expandable_segments")
        split = recorded.get("max_split_size")
        gc = recorded.get("garbage_collection_threshold")
        split_mb = s.max_split_size_mb
        if isinstance(split, int) and not isinstance(split, bool):
            split_mb = None if split < 0 or split >= 1 << 62 else split >> 20
        return cls(conf=s.conf, expandable_segments=exp if isinstance(exp, bool) else s.expandable_segments,
                   max_split_size_mb=split_mb,
                   garbage_collection_threshold=float(gc) if isinstance(gc, (int, float)) and not isinstance(gc, bool)
                   else s.garbage_collection_threshold, source="snapshot")

    def to_json(self) -> dict[str, Any]:
        """Plain data, ``PYTORCH_CUDA_ALLOC_CONF`` under that name."""
        return {"PYTORCH_CUDA_ALLOC_CONF": self.conf, "expandable_segments": self.expandable_segments,
                "max_split_size_mb": self.max_split_size_mb,
                "garbage_collection_threshold": self.garbage_collection_threshold, "source": self.source}


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None
