"""The per-rank comparison of peaks of a multi-rank group (the Memory tab's ranks table).

A multi-rank job writes one run per rank, ``<log_dir>/rank<r>``; TensorBoard lists
them as ``exp/rank0``, ``exp/rank1``, ... and :func:`tbmem._internal.logdir.runs.group_runs` groups them.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.plugin.runs import rank_peaks
    >>> from tbmem._internal.plugin.series import Series
    >>> s = Series(np.array([0, 5]), np.array([1.0, 3.0]), np.zeros(2))
    >>> row = rank_peaks({"exp/rank1": {"Memory/RAM/process_rss_GB": s}})[0]
    >>> row["rank"], row["peak_rss"] / 2**30, row["peak_rss_step"]
    (1, 3.0, 5)
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tbmem._internal.logdir.layout import split_rank
from tbmem._internal.plugin.charts import to_bytes
from tbmem._internal.plugin.series import Series
from tbmem._internal.tags import TAGS

__all__ = ["rank_peaks", "PEAK_TAGS"]

#: Comparison column -> tags whose maximum is its peak (the first present one counts).
PEAK_TAGS: dict[str, tuple[str, ...]] = {
    "peak_vram_allocated": (TAGS["vram_peak_allocated"].tag, TAGS["vram_allocated"].tag),
    "peak_vram_reserved": (TAGS["vram_peak_reserved"].tag, TAGS["vram_reserved"].tag),
    "peak_rss": (TAGS["ram_peak_rss"].tag, TAGS["ram_rss"].tag),
    "peak_census": (TAGS["census_total"].tag,),
}


def rank_peaks(per_run: Mapping[str, Mapping[str, Series]]) -> list[dict[str, Any]]:
    """Per run: each peak in bytes and the step it was reached at (None when the run lacks it)."""
    rows = []
    for run, series in per_run.items():
        row: dict[str, Any] = {"run": run, "rank": split_rank(run)[1]}
        for column, tags in PEAK_TAGS.items():
            row[column] = row[column + "_step"] = None
            for tag in tags:
                s = series.get(tag)
                if s is not None and len(s.values):
                    i = int(np.nanargmax(s.values)) if not np.all(np.isnan(s.values)) else 0
                    row[column], row[column + "_step"] = float(to_bytes(tag, s.values[i])), int(s.steps[i])
                    break
        rows.append(row)
    return rows
