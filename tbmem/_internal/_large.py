"""The large-tensor threshold of a MemoryWriter's censuses: the user's, or one relative to the run.

With ``large_tensor_mb`` set, storages at or above it are large. Unset (the default), the
threshold is 1% of the first census's total (the first with any tensor), at most 100 MB (the
design documents' fixed threshold): a small model's large tensors are counted too, instead of
``Memory/Large_Tensors/count`` staying 0 while the table lists its tensors. The threshold is
fixed at that first census, so the count of later censuses compares like with like; the
census table says which threshold applies and how it was chosen.

Example:
    >>> from tbmem._internal._large import LargeThreshold
    >>> t = LargeThreshold(None)
    >>> t.choose(total_bytes=2 * 2**20)
    (20971, "auto: 1% of the first census's 2.00 MB; set large_tensor_mb to fix it")
    >>> LargeThreshold(100.0).choose(total_bytes=0)
    (104857600, 'large_tensor_mb=100')
"""

from __future__ import annotations

from typing import Any

__all__ = ["LargeThreshold", "AUTO_FRACTION", "AUTO_CAP_BYTES"]

#: Share of the first census's total at which a storage counts as large, when no threshold is set.
AUTO_FRACTION = 0.01
#: The design documents' threshold: the relative one is never higher.
AUTO_CAP_BYTES = 100 * 2**20


class LargeThreshold:
    """Chooses, once per writer, the threshold its censuses use.

    Args:
        mb: ``MemoryWriterConfig.large_tensor_mb``; None for the relative threshold.
    """

    def __init__(self, mb: float | None) -> None:
        self._fixed: tuple[int, str] | None = None
        if mb is not None:
            self._fixed = (int(mb * 2**20), f"large_tensor_mb={mb:g}")

    def choose(self, *, total_bytes: int) -> tuple[int, str]:
        """The threshold in bytes and how it was chosen, fixing it at the first non-empty census."""
        if self._fixed is not None:
            return self._fixed
        nbytes = max(1, min(int(total_bytes * AUTO_FRACTION), AUTO_CAP_BYTES))
        rule = (f"auto: {AUTO_FRACTION:.0%} of the first census's {total_bytes / 2**20:.2f} MB; "
                "set large_tensor_mb to fix it")
        if nbytes == AUTO_CAP_BYTES:
            rule = "auto: 1% of the first census, at most 100 MB; set large_tensor_mb to fix it"
        if total_bytes > 0:
            self._fixed = (nbytes, rule)
        return nbytes, rule

    def apply(self, census: Any) -> Any:
        """``census`` with its large tensors selected at this writer's threshold."""
        nbytes, rule = self.choose(total_bytes=census.total_bytes)
        return census.with_large_threshold(nbytes, rule)
