"""The census result: records, totals, TensorBoard scalars and the top-K markdown table.

Example:
    >>> from tbmem.census.report import Census, TensorRecord
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

from tbmem.tags import tag_for, to_unit

__all__ = ["CATEGORIES", "TensorRecord", "Census"]

#: Categories in priority order: a storage reached in several roles counts in the first.
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")


@dataclass(frozen=True)
class TensorRecord:
    """One storage, counted once, named after the first (highest-priority) tensor that uses it.

    Attributes:
        name: ``encoder.conv1.weight``, ``encoder.conv1.weight.grad``,
            ``optimizer.state[encoder.conv1.weight].exp_avg``, ``MmBackward0.saved_self``,
            ``numpy <function>:<variable>``, or the type name for anonymous tensors.
        category: One of :data:`CATEGORIES`.
        shape: Shape of the tensor that named it (a view may be smaller than its storage).
        dtype: ``float32``, ``int64``, ... (numpy arrays: numpy's dtype name).
        device: ``cpu``, ``cuda:0``, ...
        bytes: Bytes of the whole storage.
        module: ``model.encoder`` for tensors of a watched model's top-level submodule, else None.
    """

    name: str
    category: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    bytes: int
    module: str | None = None


@dataclass
class Census:
    """What holds memory right now: every live storage found, counted once.

    Attributes:
        records: One record per storage, largest first.
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
        blind_spots: Named limitations -> the bytes they concern, each also explained in
            ``notes``: ``cpu_autocast_cache_max`` (inside a CPU autocast region, at most this
            many bytes of low-precision weight copies live in autocast's cache, which torch
            does not expose), ``foreign_memory_owner_not_found`` (counted bytes of tensors over
            memory torch did not allocate whose owner, which may hold more, was not found).

    Example:
        >>> import torch
        >>> from tbmem import take_census
        >>> model = torch.nn.Linear(256, 256)
        >>> census = take_census(models=[model])
        >>> census.by_category["parameters"] == (256 * 256 + 256) * 4
        True
    """

    records: list[TensorRecord]
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

    @classmethod
    def from_records(cls, records: list[TensorRecord], *, large_tensor_bytes: int, top_k: int,
                     duration_s: float = 0.0, unattributed_bytes: int | None = None,
                     notes: list[str] | None = None, heap_scan: str = "full",
                     blind_spots: dict[str, int] | None = None) -> "Census":
        """Aggregate storage records into a census."""
        ordered = sorted(records, key=lambda r: r.bytes, reverse=True)
        by_category = dict.fromkeys(CATEGORIES, 0)
        by_dtype: dict[str, int] = {}
        by_device: dict[str, int] = {}
        by_module: dict[str, int] = {}
        for rec in ordered:
            nbytes = rec.bytes
            by_category[rec.category] = by_category.get(rec.category, 0) + nbytes
            by_dtype[rec.dtype] = by_dtype.get(rec.dtype, 0) + nbytes
            by_device[rec.device] = by_device.get(rec.device, 0) + nbytes
            if rec.module is not None:
                by_module[rec.module] = by_module.get(rec.module, 0) + nbytes
        return cls(records=ordered, total_bytes=sum(by_category.values()), by_category=by_category,
                   by_dtype=by_dtype, by_device=by_device, by_module=by_module,
                   large_tensors=[r for r in ordered if r.bytes >= large_tensor_bytes],
                   large_tensor_bytes=large_tensor_bytes, unattributed_bytes=unattributed_bytes,
                   duration_s=duration_s, top_k=top_k, notes=list(notes or ()), heap_scan=heap_scan,
                   blind_spots=dict(blind_spots or {}))

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
        return dataclasses.replace(self, large_tensor_bytes=nbytes, large_rule=rule,
                                   large_tensors=[r for r in self.records if r.bytes >= nbytes])

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
        if self.blind_spots:
            lines += ["", "Blind spots: " + "; ".join(f"{name} {nbytes / mb:.2f} MB"
                                                      for name, nbytes in self.blind_spots.items())]
        if self.notes:
            lines += ["", "Notes: " + "; ".join(self.notes)]
        return "\n".join(lines)
