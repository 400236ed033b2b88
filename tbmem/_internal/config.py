"""Keyword-only configuration for :class:`tbmem.MemoryWriter`, validated at construction.

Example:
    >>> from tbmem._internal.config import MemoryWriterConfig
    >>> MemoryWriterConfig(every=50, census_every=1000).every
    50
    >>> MemoryWriterConfig(every=0)
    Traceback (most recent call last):
    ...
    ValueError: MemoryWriterConfig.every must be a positive integer, got 0
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from tbmem._internal._fields import integer, patterns, seconds, unknown_keys

__all__ = ["MemoryWriterConfig", "PEAK_MODES", "seconds", "unknown_keys"]

PEAK_MODES = ("window", "run")


@dataclass(frozen=True, kw_only=True)
class MemoryWriterConfig:
    """What :class:`tbmem.MemoryWriter` records and how often.

    Attributes:
        enabled: False turns every memory reading off (the writer still forwards
            ``add_scalar`` and friends); a disabled writer costs one attribute check.
        every: Write the memory readings at steps divisible by ``every``.
        peak_mode: ``"window"``: peaks cover the steps since the previous record
            (resets torch's peak counters and Linux's VmHWM); ``"run"``: whole-run peaks.
        census_every: Take a tensor census at steps divisible by this; 0 disables it.
        large_tensor_mb: Storages at or above this many MB count as large tensors. None (the
            default): 1% of the first census's total, at most 100 MB, then fixed for the run
            (the census table says which threshold applies).
        top_k: How many of the largest tensors the census text lists.
        uss: Also read the process's USS (costs about 4 ms per record).
        system_every_s: Read system RAM and swap (``System/ram_*``, ``System/swap_used_GB``) at
            most once per this many seconds: they change slowly, and ``/proc/meminfo`` is about a
            quarter of a record's cost inside a training step. Records in between carry no system
            readings; 0 reads them at every record.
        nvml: Also read device memory through NVML (needs the ``nvml`` extra).
        device: CUDA device index to read; None means the current device.
        flush_each_record: Flush event files after each memory record, so a run
            killed hard (SIGKILL, OOM killer) keeps every record written before. The
            writer's own events (records, ``write_scalars``: the monitors' and the census's
            scalars) are then written on the calling thread, after any queued before them.
        custom_layout: Write the custom-scalars layout that groups tbmem's charts, for the tags the
            run writes (updated when a new kind of reading appears; see tbmem._internal.layout).
        fast_crc: Checksum this writer's event records with the compiled ``google-crc32c`` instead
            of TensorBoard's pure-Python CRC (bit-identical files, ~10x cheaper writes; other
            SummaryWriters of the process keep TensorBoard's).
        snapshot: Memory snapshot settings (:class:`tbmem.SnapshotConfig`
            or a mapping of its fields); None disables snapshots.
        alerts: Memory alerts (:class:`tbmem.AlertConfig`, a mapping of its fields, or
            True for its defaults); None disables them. See docs/forecast.md.
        spikes: Loss-spike detection over the scalars written (:class:`tbmem.SpikeConfig`, a
            mapping of its fields, or True for its defaults); None disables it. See docs/analysis.md.
        sinks: Where the records go besides TensorBoard: names (``"wandb"``, ``"mlflow"``, set up
            by each library's environment variables) or sink objects (:mod:`tbmem._internal.sinks`); each
            gets every scalar event, census table and snapshot file on the same steps. docs/sinks.md.
        ranks: What happens under torch.distributed (:class:`tbmem.RanksConfig` or a
            mapping of its fields): rank folders, cross-rank aggregates. None: the defaults.
        profile: torch.profiler windows with tbmem's tracks merged into their traces
            (:class:`tbmem.ProfileConfig`, a mapping of its fields, or True for its defaults);
            None disables them. See docs/profile.md.
        loss_tags: Patterns (``fnmatch``) of the run's own loss tags besides ``Loss/*``, ``train/loss``,
            ``train_loss`` and ``loss`` (``["train/ce_loss", "val/*_loss"]``): recorded in the run
            (``plugins/tbmem/settings.jsonl``), so the Memory tab's loss panel and ``tbmem report`` find them
            in TensorBoard's and the report's own process, and watched by the spike detector (``spikes=``).
            ``TBMEM_LOSS_TAGS`` adds patterns in whichever process reads it (docs/integrations.md).
        module_depth: How many levels of a watched model the by-module breakdown names: 1,
            ``model.encoder``; 2, ``model.encoder.layers`` (``Memory/Tensor_Module/<module>_MB``: the tags
            follow the depth). ``TBMEM_MODULE_DEPTH`` overrides it in the training process.
    """

    enabled: bool = True
    every: int = 10
    peak_mode: str = "window"
    census_every: int = 500
    large_tensor_mb: float | None = None
    top_k: int = 10
    uss: bool = False
    system_every_s: float = 1.0
    nvml: bool = False
    device: int | None = None
    flush_each_record: bool = True
    custom_layout: bool = True
    fast_crc: bool = True
    snapshot: Any = field(default=None)
    alerts: Any = field(default=None)
    spikes: Any = field(default=None)
    ranks: Any = field(default=None)
    sinks: Any = field(default=())
    profile: Any = field(default=None)
    loss_tags: tuple[str, ...] = ()
    module_depth: int = 1

    def __post_init__(self) -> None:
        name = type(self).__name__
        for attr in ("every", "top_k"):
            integer(getattr(self, attr), f"{name}.{attr}", low=1, what="a positive integer")
        integer(self.census_every, f"{name}.census_every", hint=" (0 disables)")
        integer(self.module_depth, f"{name}.module_depth", low=1, what="a number of levels >= 1")
        object.__setattr__(self, "loss_tags", patterns(self.loss_tags, f"{name}.loss_tags"))
        seconds(self.system_every_s, f"{name}.system_every_s", hint=" (0: every record)")
        if self.peak_mode not in PEAK_MODES:
            raise ValueError(f"{name}.peak_mode must be one of {PEAK_MODES}, got {self.peak_mode!r}")
        mb = self.large_tensor_mb
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb <= 0):
            raise ValueError(f"{name}.large_tensor_mb must be > 0 or None (relative), got {mb!r}")
        if self.device is not None and (not isinstance(self.device, int) or self.device < 0):
            raise ValueError(f"{name}.device must be None or a device index >= 0, got {self.device!r}")
        if isinstance(self.snapshot, Mapping):
            from tbmem._internal.snapshot import SnapshotConfig

            object.__setattr__(self, "snapshot", SnapshotConfig.from_mapping(self.snapshot))
        if self.alerts is not None:
            from tbmem._internal.alerts import AlertConfig

            object.__setattr__(self, "alerts", AlertConfig.coerce(self.alerts))
        if self.spikes is not None:
            from tbmem._internal.spikes import SpikeConfig

            spikes = SpikeConfig.coerce(self.spikes)
            if spikes is not None and self.loss_tags:  # the run's losses are watched like the built-in ones
                spikes = replace(spikes, tags=tuple(dict.fromkeys((*spikes.tags, *self.loss_tags))))
            object.__setattr__(self, "spikes", spikes)
        from tbmem._internal.sinks.fanout import check_sinks

        object.__setattr__(self, "sinks", check_sinks(self.sinks, f"{name}.sinks"))
        if self.profile is not None:
            from tbmem._internal.profile.config import ProfileConfig

            object.__setattr__(self, "profile", ProfileConfig.coerce(self.profile))
        if isinstance(self.ranks, Mapping):
            from tbmem._internal.ranks.config import RanksConfig

            object.__setattr__(self, "ranks", RanksConfig.from_mapping(self.ranks))
        elif self.ranks is not None and type(self.ranks).__name__ != "RanksConfig":
            raise ValueError(f"{name}.ranks must be a RanksConfig, a mapping of its fields or None, "
                             f"got {self.ranks!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "MemoryWriterConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key."""
        problem = unknown_keys(cls, values)
        if problem:
            raise ValueError(problem)
        return cls(**dict(values))
