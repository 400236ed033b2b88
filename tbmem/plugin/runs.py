"""Runs grouped by experiment (ranks together) and the per-rank comparison of peaks.

A multi-rank job writes one run per rank, ``<log_dir>/rank<r>``; TensorBoard lists
them as ``exp/rank0``, ``exp/rank1``, ... . They form the group ``exp`` (a run named
``exp`` itself, such as rank 0's cross-rank aggregates, joins it with rank None).

Example:
    >>> from tbmem.plugin.runs import group_runs
    >>> [(g["group"], [m["rank"] for m in g["members"]]) for g in group_runs(["exp/rank1", "exp/rank0", "b"])]
    [('b', [None]), ('exp', [0, 1])]
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import numpy as np

from tbmem.plugin.charts import to_bytes
from tbmem.plugin.series import Series
from tbmem.tags import TAGS

__all__ = ["split_rank", "group_runs", "rank_peaks", "PEAK_TAGS"]

_RANK = re.compile(r"^rank(\d+)$")

#: Comparison column -> tags whose maximum is its peak (the first present one counts).
PEAK_TAGS: dict[str, tuple[str, ...]] = {
    "peak_vram_allocated": (TAGS["vram_peak_allocated"].tag, TAGS["vram_allocated"].tag),
    "peak_vram_reserved": (TAGS["vram_peak_reserved"].tag, TAGS["vram_reserved"].tag),
    "peak_rss": (TAGS["ram_peak_rss"].tag, TAGS["ram_rss"].tag),
    "peak_census": (TAGS["census_total"].tag,),
}


def split_rank(run: str) -> tuple[str, int | None]:
    """(group, rank): ``exp/rank3`` -> (``exp``, 3); ``rank3`` -> (``.``, 3); ``exp`` -> (``exp``, None)."""
    head, _, last = run.rpartition("/")
    m = _RANK.match(last)
    if m:
        return head or ".", int(m.group(1))
    return run, None


def group_runs(runs: Iterable[str]) -> list[dict[str, Any]]:
    """Groups sorted by name, members by rank (the rankless run first)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        group, rank = split_rank(run)
        groups.setdefault(group, []).append({"run": run, "rank": rank})
    return [{"group": g, "members": sorted(m, key=lambda r: (r["rank"] is not None, r["rank"] or 0))}
            for g, m in sorted(groups.items())]


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
