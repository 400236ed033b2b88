"""The Memory tab's view of a compact job: every rank's peaks, a rank x step heat map, one rank's lines.

A compact job (docs/distributed.md) has TensorBoard runs for rank 0 and a few ranks only; the
others are in its Parquet rank tables (:mod:`tbmem.logdir.rank_table`). The tab finds the job's
folder from a member run's (the parent of ``rank<r>``) and asks here for:

- :meth:`JobTables.peaks`: one row per rank, the shape of :func:`tbmem.plugin.runs.rank_peaks`;
- :meth:`JobTables.heatmap`: VRAM allocated per rank and step (RSS for a job without VRAM),
  the steps cut into at most ``columns`` bins, each bin the highest value in it;
- :meth:`JobTables.rank_series`: one rank's memory lines (the drill-down of a rank without a run).

Each answer is computed by columnar operations (pyarrow, numpy) and kept until a table file
changes (size or time), so the tab's first view of a 1,000-rank job is one read.

Example:
    >>> import os, tempfile
    >>> from tbmem.logdir.rank_table import RankTableWriter
    >>> from tbmem.plugin.rank_table import JobTables
    >>> job = os.path.realpath(tempfile.mkdtemp())
    >>> table = RankTableWriter(os.path.join(job, "ranks", "node0.parquet"))
    >>> for rank in range(2):
    ...     for step in (0, 10, 20):
    ...         table.add(rank, step, 0.0, {"Memory/GPU/vram_allocated_GB": rank + step / 10})
    >>> table.close()
    >>> tables = JobTables()
    >>> heat = tables.heatmap(job, job, columns=2)
    >>> heat["ranks"], heat["steps"], [[v / 2**30 for v in row] for row in heat["values"]]
    ([0, 1], [10, 20], [[1.0, 2.0], [2.0, 3.0]])
    >>> [(r["rank"], r["peak_vram_allocated"] / 2**30, r["peak_vram_allocated_step"]) for r in tables.peaks(job, job)]
    [(0, 2.0, 20), (1, 3.0, 20)]
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from tbmem._extras import require
from tbmem.logdir.rank_table import rank_table_paths, read_rank_table
from tbmem.plugin.charts import to_bytes
from tbmem.plugin.runs import PEAK_TAGS
from tbmem.tags import TAGS

__all__ = ["JobTables", "HEAT_TAGS"]

#: The heat map's reading: the first tag the job has.
HEAT_TAGS = (TAGS["vram_allocated"].tag, TAGS["vram_peak_allocated"].tag, TAGS["ram_rss"].tag)
_LINES = (TAGS["vram_allocated"].tag, TAGS["vram_reserved"].tag, TAGS["vram_peak_allocated"].tag,
          TAGS["ram_rss"].tag, TAGS["ram_tree_rss"].tag)


def _columns(job_dir: str, root: str, tags: tuple[str, ...], rank: int | None = None) -> dict[str, np.ndarray]:
    """``rank``, ``step``, ``tag`` (as strings), ``value`` of the rows of ``tags`` (one rank's, if given)."""
    pc = require("pyarrow.compute", extra="ranks")
    filters: list[Any] = [("tag", "in", list(tags))]
    if rank is not None:
        filters.append(("rank", "=", rank))
    table = read_rank_table(job_dir, columns=["rank", "step", "tag", "value"], root=root, filters=filters)
    tag = table.column("tag").combine_chunks()
    if hasattr(tag, "dictionary_decode"):
        tag = tag.dictionary_decode()
    return {"rank": table.column("rank").to_numpy(), "step": table.column("step").to_numpy(),
            "tag": pc.cast(tag, "string").to_numpy(zero_copy_only=False), "value": table.column("value").to_numpy()}


class JobTables:
    """Answers about compact jobs' rank tables, cached until a table file changes."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def has_tables(job_dir: str) -> bool:
        """Whether the job has rank tables."""
        return bool(rank_table_paths(job_dir))

    def _cached(self, key: tuple[Any, ...], job_dir: str, make: Any) -> Any:
        stamp = tuple((p, st.st_size, st.st_mtime_ns) for p in rank_table_paths(job_dir)
                      for st in [os.stat(p, follow_symlinks=False)])
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = make()
        with self._lock:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = (stamp, value)
        return value

    def peaks(self, job_dir: str, root: str) -> list[dict[str, Any]]:
        """One row per rank: each peak in bytes and its step (:data:`tbmem.plugin.runs.PEAK_TAGS`)."""
        return self._cached(("peaks", job_dir), job_dir, lambda: self._peaks(job_dir, root))

    def _peaks(self, job_dir: str, root: str) -> list[dict[str, Any]]:
        wanted = tuple(sorted({t for tags in PEAK_TAGS.values() for t in tags}))
        c = _columns(job_dir, root, wanted)
        ranks = np.unique(c["rank"])
        rows = {int(r): {"run": None, "rank": int(r)} for r in ranks}
        for column, tags in PEAK_TAGS.items():
            done: set[int] = set()
            for r in rows.values():
                r[column] = r[column + "_step"] = None
            for tag in tags:  # the first present tag counts, per rank
                mask = c["tag"] == tag
                if not mask.any():
                    continue
                rk, st, va = c["rank"][mask], c["step"][mask], c["value"][mask]
                order = np.lexsort((-st, va, rk))  # per rank: the highest value last, the earliest step on a tie
                last = np.r_[rk[order][1:] != rk[order][:-1], True]
                for i in order[last]:
                    rank = int(rk[i])
                    if rank in done:
                        continue
                    done.add(rank)
                    rows[rank][column] = float(to_bytes(tag, va[i]))
                    rows[rank][column + "_step"] = int(st[i])
        return [rows[r] for r in sorted(rows)]

    def heatmap(self, job_dir: str, root: str, *, columns: int = 200) -> dict[str, Any]:
        """``{"tag", "ranks", "steps" (each bin's last step), "values" (bytes; rank x bin, None: no
        record)}``, each bin the highest value of its steps."""
        return self._cached(("heat", job_dir, columns), job_dir, lambda: self._heatmap(job_dir, root, columns))

    def _heatmap(self, job_dir: str, root: str, columns: int) -> dict[str, Any]:
        c = _columns(job_dir, root, HEAT_TAGS)
        tag = next((t for t in HEAT_TAGS if (c["tag"] == t).any()), None)
        if tag is None:
            return {"tag": None, "ranks": [], "steps": [], "values": []}
        mask = c["tag"] == tag
        rk, st, va = c["rank"][mask], c["step"][mask], c["value"][mask]
        ranks, row = np.unique(rk, return_inverse=True)
        steps, pos = np.unique(st, return_inverse=True)
        bins = min(columns, len(steps))
        col = pos * bins // len(steps)
        grid = np.full((len(ranks), bins), -np.inf)
        np.maximum.at(grid, (row, col), va)
        last_step = np.zeros(bins, dtype=np.int64)
        np.maximum.at(last_step, col, st)
        scaled = to_bytes(tag, grid)
        values = [[None if not np.isfinite(v) else float(v) for v in line] for line in scaled.tolist()]
        return {"tag": tag, "ranks": ranks.tolist(), "steps": last_step.tolist(), "values": values}

    def rank_series(self, job_dir: str, root: str, rank: int) -> dict[str, Any]:
        """One rank's memory lines: ``{tag: {"steps": [...], "values": [bytes...]}}``."""
        return self._cached(("rank", job_dir, rank), job_dir, lambda: self._rank_series(job_dir, root, rank))

    @staticmethod
    def _rank_series(job_dir: str, root: str, rank: int) -> dict[str, Any]:
        c = _columns(job_dir, root, _LINES, rank=rank)
        out = {}
        for tag in _LINES:
            mask = c["tag"] == tag
            if mask.any():
                order = np.argsort(c["step"][mask], kind="stable")
                out[tag] = {"steps": c["step"][mask][order].tolist(),
                            "values": np.asarray(to_bytes(tag, c["value"][mask][order]), dtype=float).tolist()}
        return out
