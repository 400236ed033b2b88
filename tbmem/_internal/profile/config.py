"""Keyword-only configuration of profile windows (:class:`ProfileConfig`), validated at construction.

Example:
    >>> from tbmem._internal.profile.config import ProfileConfig
    >>> ProfileConfig(every=100, steps=3).windows_at(range(0, 400))
    [100, 200, 300]
    >>> ProfileConfig.from_mapping({"evry": 5})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown ProfileConfig key 'evry' (did you mean 'every'?); valid keys: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from tbmem._internal._fields import flags, integer, optional_config, unknown_keys

__all__ = ["ProfileConfig"]


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """When :class:`tbmem.MemoryWriter` runs ``torch.profiler``, and what it records.

    A window is ``steps`` consecutive steps ``[s, s + steps)`` for ``s`` divisible by ``every``
    (from ``start`` on); its trace is written when it closes, as
    ``plugins/tbmem/traces/step<s>/rank<r>.pt.trace.json.gz`` (docs/profile.md).

    Attributes:
        enabled: False: no window ever opens (the configuration is kept).
        every: A window starts at steps divisible by this.
        steps: How many steps one window covers.
        start: The first step a window may start at (the first steps warm caches and the allocator).
        max_windows: At most this many windows per run; 0: no limit.
        record_shapes: torch.profiler's ``record_shapes`` (input shapes of each operator).
        profile_memory: torch.profiler's ``profile_memory`` (bytes each operator allocates and frees).
        with_stack: torch.profiler's ``with_stack`` (Python stacks; large traces, slow).
        cuda: Also profile CUDA kernels when CUDA is available.
        census: Take a tensor census at every step of a window (when the writer's census is on), so the
            categories' counter tracks have a value per step.
        max_trace_mb: A window's gzip'd trace larger than this is not written (reported once).

    Example:
        >>> ProfileConfig(every=50, steps=2).steps
        2
        >>> ProfileConfig(every=2, steps=3)
        Traceback (most recent call last):
        ...
        ValueError: ProfileConfig.steps (3) must be at most every (2): windows would overlap
    """

    enabled: bool = True
    every: int = 500
    steps: int = 3
    start: int = 10
    max_windows: int = 5
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    cuda: bool = True
    census: bool = True
    max_trace_mb: float = 256.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        for attr in ("every", "steps"):
            integer(getattr(self, attr), f"{name}.{attr}", low=1, what="a positive integer")
        for attr in ("start", "max_windows"):
            integer(getattr(self, attr), f"{name}.{attr}")
        flags(self, "enabled", "record_shapes", "profile_memory", "with_stack", "cuda", "census")
        if self.steps > self.every:
            raise ValueError(f"{name}.steps ({self.steps}) must be at most every ({self.every}): "
                             "windows would overlap")
        mb = self.max_trace_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not mb > 0:
            raise ValueError(f"{name}.max_trace_mb must be a number > 0, got {mb!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ProfileConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key."""
        problem = unknown_keys(cls, values)
        if problem:
            raise ValueError(problem)
        return cls(**dict(values))

    @classmethod
    def coerce(cls, value: Any) -> "ProfileConfig | None":
        """A ProfileConfig from itself, a mapping of its fields, True (the defaults) or None/False (off)."""
        return optional_config(cls, value, "profile must be a ProfileConfig, a mapping of its fields, true or null")

    def first_window(self, step: int) -> int:
        """The first window start at or after ``step``."""
        s = max(step, self.start)
        return -(-s // self.every) * self.every

    def windows_at(self, steps: Iterable[int]) -> list[int]:
        """The window starts among ``steps`` (``max_windows`` not applied)."""
        return [s for s in steps if s >= self.start and s % self.every == 0]
