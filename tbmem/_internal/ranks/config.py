"""Keyword-only settings of tbmem's behaviour under torch.distributed (:class:`RanksConfig`).

Example:
    >>> from tbmem._internal.ranks import RanksConfig
    >>> RanksConfig.from_mapping({"timeout_s": 60}).timeout_s
    60.0
    >>> RanksConfig(layout="compact").compact(world_size=8), RanksConfig().compact(world_size=65)
    (True, True)
    >>> RanksConfig(tags=("ram_rss", "no_such_reading"))
    Traceback (most recent call last):
    ...
    ValueError: RanksConfig.tags: unknown reading 'no_such_reading'; readings are the keys of tbmem._internal.tags.TAGS without {name}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tbmem._internal._fields import flags, integer, seconds, unknown_keys

__all__ = ["RanksConfig", "DEFAULT_RANK_TAGS", "LAYOUTS"]

#: Readings aggregated across ranks by default (keys of :data:`tbmem.TAGS`).
#: The layouts of a job's runs (docs/distributed.md): ``auto`` is ``compact`` above ``compact_above`` ranks.
LAYOUTS = ("auto", "per_rank", "compact")

DEFAULT_RANK_TAGS = ("ram_rss", "ram_tree_rss", "vram_allocated", "vram_reserved", "vram_peak_allocated",
                     "vram_peak_reserved", "step_time")


@dataclass(frozen=True, kw_only=True)
class RanksConfig:
    """What a :class:`tbmem.MemoryWriter` does when the job has more than one rank.

    The job has more than one rank when ``torch.distributed`` is initialised with a
    world size above 1, or, before the process group exists, when torchrun's
    ``RANK`` and ``WORLD_SIZE`` say so. A single-process run ignores all of this.

    Attributes:
        enabled: False: behave as a single process (every rank writes ``log_dir`` itself;
            no aggregates, no out-of-memory signal). Set it alike on every rank.
        subfolder: Each rank writes its run to ``<log_dir>/rank<r>``.
        aggregate: Rank 0 writes ``Ranks/<tag>/max|min|mean|argmax`` at every step
            divisible by ``every``, from one gather per record over a gloo group of its own.
        tags: Readings aggregated (keys of :data:`tbmem.TAGS`).
        timeout_s: Longest wait for a record's collective when ranks are out of step (a rank
            called ``log_memory`` with other steps, or stopped): then aggregation is switched
            off on that rank and training goes on. Also the gloo group's own timeout.
        oom_wait_s: How long a rank that ran out of memory waits for the other ranks to
            write their snapshots before the error goes on to the user (0: no wait).
        layout: ``per_rank``: every rank writes its TensorBoard run ``rank<r>``. ``compact``:
            TensorBoard runs only for rank 0 (the job's aggregates) and the ranks that matter (the
            ranks at the peak of VRAM and RSS, a rank that ran out of memory or fired an alert);
            every rank's records go to one Parquet file per node (``ranks/node<n>.parquet``; needs
            pyarrow, the ``ranks`` extra). ``auto``: ``compact`` above ``compact_above`` ranks.
        compact_above: The number of ranks above which ``auto`` is ``compact``.
    """

    enabled: bool = True
    subfolder: bool = True
    aggregate: bool = True
    tags: tuple[str, ...] = DEFAULT_RANK_TAGS
    timeout_s: float = 300.0
    oom_wait_s: float = 10.0
    layout: str = "auto"
    compact_above: int = 64

    def __post_init__(self) -> None:
        name = type(self).__name__
        flags(self, "enabled", "subfolder", "aggregate")
        tags = self.tags
        if isinstance(tags, (str, bytes)) or not hasattr(tags, "__iter__"):
            raise ValueError(f"{name}.tags must be a list of reading keys, got {tags!r}")
        from tbmem._internal.tags import TAGS

        tags = tuple(dict.fromkeys(tags))
        for key in tags:
            if key not in TAGS or "{name}" in TAGS[key].tag:
                raise ValueError(f"{name}.tags: unknown reading {key!r}; readings are the keys of "
                                 "tbmem._internal.tags.TAGS without {name}")
        object.__setattr__(self, "tags", tags)
        if self.layout not in LAYOUTS:
            raise ValueError(f"{name}.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        integer(self.compact_above, f"{name}.compact_above", low=1, what="a whole number of ranks >= 1")
        for attr, low in (("timeout_s", 1.0), ("oom_wait_s", 0.0)):
            object.__setattr__(self, attr, seconds(getattr(self, attr), f"{name}.{attr}", low=low))

    def compact(self, world_size: int) -> bool:
        """Whether a job of ``world_size`` ranks writes the compact layout."""
        return self.layout == "compact" or (self.layout == "auto" and world_size > self.compact_above)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "RanksConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key."""
        problem = unknown_keys(cls, values)
        if problem:
            raise ValueError(problem)
        data = dict(values)
        if "tags" in data and not isinstance(data["tags"], (str, bytes)) and data["tags"] is not None:
            data["tags"] = tuple(data["tags"])
        return cls(**data)
