"""Keyword-only settings of memory snapshots (:class:`SnapshotConfig`).

Example:
    >>> from tbmem._internal.snapshot import SnapshotConfig
    >>> cfg = SnapshotConfig.from_mapping({"every": 100, "window": 2, "max_snapshots": 5})
    >>> cfg.is_due(200), cfg.is_due(150)
    (True, False)
    >>> SnapshotConfig(stacks="perl")
    Traceback (most recent call last):
    ...
    ValueError: SnapshotConfig.stacks must be one of ('python', 'all', 'none'), got 'perl'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tbmem._internal._fields import flags, integer, unknown_keys

__all__ = ["SnapshotConfig", "RECORDERS", "STACKS"]

RECORDERS = ("auto", "cuda", "allocator", "dispatch", "off")
STACKS = ("python", "all", "none")


@dataclass(frozen=True, kw_only=True)
class SnapshotConfig:
    """When and how memory snapshots are recorded and kept.

    A step is *due* when it is listed in ``steps`` or is a multiple of ``every``
    (and ``>= start_step``). ``on_step(step)`` is called at the end of each step.

    Attributes:
        enabled: False turns snapshots off (nothing is recorded, nothing written).
        start_step: Recording starts with this step (continuous mode).
        every: Snapshot at steps divisible by this; 0 disables periodic snapshots.
        steps: Extra steps to snapshot (e.g. ``(1000, 5000)``).
        window: 0: record continuously from ``start_step`` (each snapshot shows the
            last ``max_entries`` events); w > 0: for each due step s record only
            steps [s, s + w) and write the snapshot at the end of step s + w - 1.
        max_entries: Most events kept in memory (oldest dropped first).
        stacks: ``"python"`` (default), ``"all"`` (CUDA: C++ frames too) or ``"none"``.
        stack_depth: Python frames kept per allocation by the every-device recorder.
        max_snapshots: Regular snapshots kept on disk (oldest removed first); 0 = unlimited.
        max_disk_mb: Disk budget for all snapshot files of this rank; 0 = unlimited.
            The out-of-memory snapshot is always kept and never counted as prunable.
        html: Also write the offline viewer HTML next to each snapshot.
        pickle: Also write CUDA snapshots as pickle (protocol 4) for PyTorch's tools.
        torch_pickle: Also write each snapshot that has no CUDA pickle (a CPU run's) as a ``.pickle`` in
            torch's ``_snapshot()`` format (:mod:`tbmem._internal.snapshot.torch_format`: plain data, protocol 4),
            which ``torch.cuda._memory_viz`` and pytorch.org/memory_viz open.
        rank: Rank in file names; None reads ``RANK`` from the environment (else 0).
        recorder: ``"auto"`` (CUDA history when CUDA is initialised, an Intel XPU's allocator history
            where no CUDA is and this torch records it (``torch.xpu.memory._record_memory_history``), else the CPU allocator
            recorder where the model is on the CPU and it can be built, else dispatch),
            ``"cuda"``, ``"allocator"`` (torch's CPU allocator wrapped), ``"dispatch"`` (a
            dispatch mode: every device; see docs/snapshots.md) or ``"off"`` (only the
            out-of-memory snapshot, from CUDA when available).
        on_oom: Write a snapshot when an out-of-memory error reaches ``monitored_step``.
    """

    enabled: bool = True
    start_step: int = 0
    every: int = 0
    steps: tuple[int, ...] = ()
    window: int = 0
    max_entries: int = 100_000
    stacks: str = "python"
    stack_depth: int = 16
    max_snapshots: int = 10
    max_disk_mb: float = 1024.0
    html: bool = True
    pickle: bool = True
    torch_pickle: bool = False
    rank: int | None = None
    recorder: str = "auto"
    on_oom: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        for attr, low in (("start_step", 0), ("every", 0), ("window", 0), ("max_snapshots", 0),
                          ("max_entries", 1), ("stack_depth", 1)):
            integer(getattr(self, attr), f"{name}.{attr}", low=low)
        steps = self.steps
        if isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__"):
            raise ValueError(f"{name}.steps must be a list of step numbers, got {steps!r}")
        steps = tuple(steps)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise ValueError(f"{name}.steps must hold integers >= 0, got {steps!r}")
        object.__setattr__(self, "steps", tuple(sorted(set(steps))))
        if not isinstance(self.max_disk_mb, (int, float)) or isinstance(self.max_disk_mb, bool) \
                or self.max_disk_mb < 0:
            raise ValueError(f"{name}.max_disk_mb must be >= 0 (0 = unlimited), got {self.max_disk_mb!r}")
        if self.stacks not in STACKS:
            raise ValueError(f"{name}.stacks must be one of {STACKS}, got {self.stacks!r}")
        if self.recorder not in RECORDERS:
            raise ValueError(f"{name}.recorder must be one of {RECORDERS}, got {self.recorder!r}")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                                      or self.rank < 0):
            raise ValueError(f"{name}.rank must be None or an integer >= 0, got {self.rank!r}")
        flags(self, "enabled", "html", "pickle", "torch_pickle", "on_oom")

    def is_due(self, step: int) -> bool:
        """Whether a snapshot is due at ``step`` (the window's first step in window mode)."""
        if step < self.start_step:
            return step in self.steps
        return (self.every > 0 and step % self.every == 0) or step in self.steps

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SnapshotConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key.

        ``snapshot_every`` is accepted as an alias of ``every``.
        """
        data = dict(values)
        if "snapshot_every" in data:
            if "every" in data:
                raise ValueError(f"{cls.__name__}: give either every or snapshot_every, not both")
            data["every"] = data.pop("snapshot_every")
        problem = unknown_keys(cls, data)
        if problem:
            raise ValueError(problem)
        if "steps" in data and data["steps"] is not None and not isinstance(data["steps"], (str, bytes)):
            data["steps"] = tuple(data["steps"])
        return cls(**data)
