"""The census result: records, totals, TensorBoard scalars and the top-K markdown table.

Example:
    >>> from tbmem._internal.census.report import Census, TensorRecord
    >>> rec = TensorRecord(name="fc.weight", category="parameters", shape=(256, 1024),
    ...                    dtype="float32", device="cpu", bytes=2**20, module="model.fc")
    >>> census = Census.from_records([rec], large_tensor_bytes=2**20, top_k=5, duration_s=0.01)
    >>> census.by_category["parameters"], census.large_count
    (1048576, 1)
    >>> census.scalars()["Memory/Tensor_Category/parameters_MB"]
    1.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from tbmem._internal.census.table import Records, TensorRecord
from tbmem._internal.tags import tag_for, to_unit

__all__ = ["CATEGORIES", "TensorRecord", "Census"]

#: Categories in priority order: a storage reached in several roles counts in the first.
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")


@dataclass
class Census:
    """What holds memory right now: every live storage found, counted once.

    Attributes:
        records: One record per storage, largest first (a sequence that makes the records as they
            are read: a census of 100k small storages does not pay for 100k record objects).
        total_bytes: Sum over all records.
        by_category: Bytes per category (every category present, zeros included).
        by_dtype, by_device, by_module: Bytes per dtype, device and watched top-level submodule.
        large_tensors: Records at or above ``large_tensor_bytes``, largest first.
        large_rule: How that threshold was chosen (shown in the table), e.g. ``"1% of the first census"``.
        where: When in the training step the census was taken (shown in the table).
        unattributed_bytes: On CUDA, ``memory_allocated`` minus the census bytes on that
            device (allocator rounding, tensors no scan can see); None without CUDA.
        duration_s: Wall time the census took.
        top_k: Rows of the markdown table.
        notes: What could not be counted (reported once on the ``tbmem`` logger too).
        heap_scan: ``"full"`` (the whole heap was traversed) or ``"incremental"`` (the
            survivors of the last census plus the objects created since; same result).
        blind_spots: Named limitations -> the bytes they concern (docs/census.md, "Blind spots"):
            ``cpu_autocast_cache_max`` (inside a CPU autocast region, at most this many bytes of
            low-precision weight copies live in autocast's cache, which torch does not expose),
            ``foreign_memory_owner_not_found`` (counted bytes of tensors over memory torch did not
            allocate whose owner, which may hold more, was not found), and the others listed there.
        blind_spot_notes: The same names -> one plain sentence each, with the bytes (also in
            ``notes``, which the table shows apart from them).

    Example:
        >>> import torch
        >>> from tbmem import take_census
        >>> model = torch.nn.Linear(256, 256)
        >>> census = take_census(models=[model])
        >>> sum(r.bytes for r in census.records if r.module == "model") == (256 * 256 + 256) * 4
        True
    """

    records: Sequence[TensorRecord]
    total_bytes: int
    by_category: dict[str, int]
    by_dtype: dict[str, int]
    by_device: dict[str, int]
    by_module: dict[str, int]
    large_tensors: list[TensorRecord]
    large_tensor_bytes: int
    large_rule: str = ""
    where: str = ""
    unattributed_bytes: int | None = None
    duration_s: float = 0.0
    top_k: int = 10
    notes: list[str] = field(default_factory=list)
    heap_scan: str = "full"
    blind_spots: dict[str, int] = field(default_factory=dict)
    blind_spot_notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Sequence[TensorRecord], *, large_tensor_bytes: int, top_k: int,
                     duration_s: float = 0.0, unattributed_bytes: int | None = None,
                     notes: list[str] | None = None, heap_scan: str = "full",
                     blind_spots: dict[str, int] | None = None,
                     blind_spot_notes: dict[str, str] | None = None) -> "Census":
        """Aggregate storage records into a census."""
        named = list(records)
        return cls.from_table(Records(named, list(range(len(named))), []), large_tensor_bytes=large_tensor_bytes,
                              top_k=top_k, duration_s=duration_s, unattributed_bytes=unattributed_bytes, notes=notes,
                              heap_scan=heap_scan, blind_spots=blind_spots, blind_spot_notes=blind_spot_notes)

    @classmethod
    def from_table(cls, records: Records, *, large_tensor_bytes: int, top_k: int, duration_s: float = 0.0,
                   unattributed_bytes: int | None = None, notes: list[str] | None = None, heap_scan: str = "full",
                   blind_spots: dict[str, int] | None = None,
                   blind_spot_notes: dict[str, str] | None = None) -> "Census":
        """Aggregate records kept as named records and blocks of columns (:mod:`tbmem._internal.census.table`)."""
        by_category = dict.fromkeys(CATEGORIES, 0)
        by_dtype: dict[str, int] = {}
        by_device: dict[str, int] = {}
        by_module: dict[str, int] = {}
        for rec in records.named:
            nbytes = rec.bytes
            by_category[rec.category] = by_category.get(rec.category, 0) + nbytes
            by_dtype[rec.dtype] = by_dtype.get(rec.dtype, 0) + nbytes
            by_device[rec.device] = by_device.get(rec.device, 0) + nbytes
            if rec.module is not None:
                by_module[rec.module] = by_module.get(rec.module, 0) + nbytes
        for block in records.blocks:
            by_category[block.category] = by_category.get(block.category, 0) + int(block.nbytes.sum())
            for table, column in ((by_dtype, "dtype"), (by_device, "device")):
                for key, nbytes in block.sums(column).items():
                    table[key] = table.get(key, 0) + nbytes
            if block.module is not None:
                by_module[block.module] = by_module.get(block.module, 0) + int(block.nbytes.sum())
        return cls(records=records, total_bytes=sum(by_category.values()), by_category=by_category,
                   by_dtype=by_dtype, by_device=by_device, by_module=by_module,
                   large_tensors=records.at_least(large_tensor_bytes),
                   large_tensor_bytes=large_tensor_bytes, unattributed_bytes=unattributed_bytes,
                   duration_s=duration_s, top_k=top_k, heap_scan=heap_scan, blind_spots=dict(blind_spots or {}),
                   blind_spot_notes=dict(blind_spot_notes or {}),
                   notes=[*(blind_spot_notes or {}).values(), *(n for n in notes or () if n not in
                                                                 (blind_spot_notes or {}).values())])

    @property
    def large_count(self) -> int:
        """Number of storages at or above the large-tensor threshold."""
        return len(self.large_tensors)

    @property
    def large_total_bytes(self) -> int:
        """Bytes of those storages."""
        return sum(r.bytes for r in self.large_tensors)

    def with_large_threshold(self, nbytes: int, rule: str = "") -> "Census":
        """This census with ``large_tensors`` re-selected at ``nbytes``, saying how it was chosen."""
        records = self.records
        large = records.at_least(nbytes) if isinstance(records, Records) else [r for r in records if r.bytes >= nbytes]
        return dataclasses.replace(self, large_tensor_bytes=nbytes, large_rule=rule, large_tensors=large)

    def scalars(self) -> dict[str, float]:
        """TensorBoard tag -> value in the tag's unit (MB, ms, count), per the tag table."""
        out: dict[str, float] = {}
        for cat, nbytes in self.by_category.items():
            out[tag_for("census_category", cat)] = to_unit("census_category", nbytes)
        if self.unattributed_bytes is not None:
            out[tag_for("census_unattributed")] = to_unit("census_unattributed", self.unattributed_bytes)
        for key, table in (("census_dtype", self.by_dtype), ("census_device", self.by_device),
                           ("census_module", self.by_module)):
            for name, nbytes in table.items():
                out[tag_for(key, name)] = to_unit(key, nbytes)
        out[tag_for("census_total")] = to_unit("census_total", self.total_bytes)
        out[tag_for("census_duration")] = to_unit("census_duration", self.duration_s)
        out[tag_for("large_count")] = to_unit("large_count", self.large_count)
        out[tag_for("large_total")] = to_unit("large_total", self.large_total_bytes)
        return out

    def to_markdown(self) -> str:
        """The top-K largest storages as a markdown table, with the totals above it."""
        mb = 2.0**20
        rule = f" ({self.large_rule})" if self.large_rule else ""
        lines = [
            f"**Tensor census**: {self.total_bytes / mb:.2f} MB in {len(self.records)} storages "
            f"({self.duration_s * 1e3:.1f} ms, {self.heap_scan} heap scan); {self.large_count} "
            f"({self.large_total_bytes / mb:.2f} MB) at or above the large-tensor threshold of "
            f"{self.large_tensor_bytes / mb:.3g} MB{rule}.",
            "",
            *([f"Taken {self.where}.", ""] if self.where else []),
            "| # | name | category | shape | dtype | device | MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, rec in enumerate(self.records[: self.top_k], 1):
            shape = "x".join(map(str, rec.shape)) or "scalar"
            name = rec.name.replace("|", "\\|")
            lines.append(f"| {i} | `{name}` | {rec.category} | {shape} | {rec.dtype} | {rec.device} "
                         f"| {rec.bytes / mb:.3f} |")
        if self.unattributed_bytes is not None:
            lines += ["", f"Unattributed on the device: {self.unattributed_bytes / mb:.2f} MB."]
        explained = self.blind_spot_notes
        if self.blind_spots:
            lines += ["", "Blind spots (memory the census cannot see, or counts without its owner):"]
            lines += [f"- {explained.get(name) or f'{name}: {nbytes / mb:.2f} MB'}."
                      for name, nbytes in self.blind_spots.items()]
        others = [n for n in self.notes if n not in explained.values()]
        if others:
            lines += ["", "Notes: " + "; ".join(others)]
        return "\n".join(lines)
