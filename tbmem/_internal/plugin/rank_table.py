"""The Memory tab's view of a compact job: every rank's peaks, a rank x step heat map, one rank's lines.

A compact job (docs/distributed.md) has TensorBoard runs for rank 0 and a few ranks only; the
others are in its Parquet rank tables (:mod:`tbmem._internal.logdir.rank_table`). The tab finds the job's
folder from a member run's (the parent of ``rank<r>``) and asks here for:

- :meth:`JobTables.peaks`: one row per rank, the shape of :func:`tbmem._internal.plugin.runs.rank_peaks`;
- :meth:`JobTables.heatmap`: VRAM allocated per rank and step (RSS for a job without VRAM),
  the steps cut into at most ``columns`` bins, each bin the highest value in it;
- :meth:`JobTables.rank_series`: one rank's memory lines (the drill-down of a rank without a run).

Each answer is computed by columnar operations (pyarrow, numpy) and kept until a table file
changes (size or time), so the tab's first view of a 1,000-rank job is one read.

The tables are untrusted (a shared logdir): a request reads at most :data:`MAX_ROWS` rows (counted
from the files' footers before any is read: more is a :class:`RankTableError` 413, which the cache
keeps too), one computation runs at a time and concurrent requests share its answer, a rank value
never sizes an allocation (rows of a negative rank are skipped), and a node file that cannot be
read is skipped and named (``skipped``) while the other nodes' ranks are served.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.rank_table import RankTableWriter
    >>> from tbmem._internal.plugin.rank_table import JobTables
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
from typing import Any, Iterator

import numpy as np

from tbmem._internal._extras import require
from tbmem._internal.logdir.rank_table import rank_table_paths
from tbmem._internal.logdir.safe_open import open_regular_below
from tbmem._internal.plugin.charts import to_bytes
from tbmem._internal.plugin.runs import PEAK_TAGS
from tbmem._internal.tags import TAGS

__all__ = ["JobTables", "HEAT_TAGS", "MAX_ROWS", "RankTableError"]

#: The most rows of a job's rank tables one answer reads (1,000 ranks x 2,000 records; about 90 bytes
#: of memory a row while an answer is computed).
MAX_ROWS = 2_000_000


class RankTableError(Exception):
    """A job's tables cannot be answered; ``status`` is the HTTP status, the message is safe to show.

    Example:
        >>> RankTableError(413, "too many rows").status
        413
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

#: The heat map's reading: the first tag the job has.
HEAT_TAGS = (TAGS["vram_allocated"].tag, TAGS["vram_peak_allocated"].tag, TAGS["ram_rss"].tag)
_COLUMNS = 200  # the heat map's step bins in the tab
_LINES = (TAGS["vram_allocated"].tag, TAGS["vram_reserved"].tag, TAGS["vram_peak_allocated"].tag,
          TAGS["ram_rss"].tag, TAGS["ram_tree_rss"].tag)


def _scan(job_dir: str, root: str, tags: tuple[str, ...], rank: int | None = None,
          skipped: list[dict[str, str]] | None = None) -> Iterator[dict[str, Any]]:
    """Per node file: ``rank``, ``step`` and ``{tag: values (NaN: not in that record)}`` of the tags
    in ``tags`` the file has (only those columns are read), one rank's rows if ``rank`` is given.
    A rank's rows are all in its node's file. A file that cannot be read is named in ``skipped``.

    Raises:
        RankTableError: 413, the files hold more than :data:`MAX_ROWS` rows to read.
    """
    pq = require("pyarrow.parquet", extra="ranks")
    handles, chosen = [], []
    try:
        rows = 0
        for path in rank_table_paths(job_dir):
            try:
                fd, _ = open_regular_below(root, path)
                fh = os.fdopen(fd, "rb")
                handles.append(fh)
                source = pq.ParquetFile(fh)
                meta = source.metadata
                # only the row groups whose statistics may hold the rank (a rank's flushes)
                groups = [i for i in range(source.num_row_groups) if rank is None or _may_hold(meta.row_group(i), rank)]
                rows += sum(meta.row_group(i).num_rows for i in groups)
            except Exception as exc:  # noqa: BLE001 - a damaged node file: the other nodes are still served
                _skip(skipped, path, exc)
                continue
            if rows > MAX_ROWS:  # counted from the footers before a row is read
                raise RankTableError(413, f"the job's rank tables hold more than {MAX_ROWS:,} rows to read "
                                          f"({os.path.basename(path)} and the files before it); the tab reads at "
                                          "most that many: use `tbmem report` on the job")
            if groups:
                chosen.append((path, source, groups))
        for path, source, groups in chosen:
            try:
                have = [t for t in tags if t in source.schema_arrow.names]
                table = source.read_row_groups(groups, columns=["rank", "step", *have])
                ranks = table.column("rank").to_numpy(zero_copy_only=False)
                keep = ranks >= 0 if rank is None else ranks == rank  # a negative rank is no rank: skipped
                part = {"rank": ranks[keep], "step": table.column("step").to_numpy(zero_copy_only=False)[keep],
                        "values": {t: table.column(t).to_numpy(zero_copy_only=False).astype(float)[keep]
                                   for t in have}}
                del table
            except Exception as exc:  # noqa: BLE001 - damaged past its footer
                _skip(skipped, path, exc)
                continue
            yield part
    finally:
        for fh in handles:
            fh.close()


def _skip(skipped: list[dict[str, str]] | None, path: Any, exc: BaseException) -> None:
    if skipped is not None:
        name = os.path.basename(str(path))
        skipped.append({"file": name, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"})


def _may_hold(group: Any, rank: int) -> bool:
    stats = group.column(0).statistics  # the rank column
    return stats is None or not stats.has_min_max or stats.min <= rank <= stats.max


def _dense(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(the ranks present, sorted; each row's index among them)``: np.unique's inverse sorts every row
    (1.4 s for 4 million), ranks are small integers: a lookup table does it in milliseconds."""
    if not len(ranks):
        return ranks, ranks
    if ranks.min() < 0 or ranks.max() > 4 * len(ranks) + 4096:  # sparse or hostile values: never sized by them
        present, inverse = np.unique(ranks, return_inverse=True)
        return present, inverse
    present = np.flatnonzero(np.bincount(ranks))
    lookup = np.zeros(int(present[-1]) + 1, dtype=np.int64)
    lookup[present] = np.arange(len(present))
    return present, lookup[ranks]


def _peaks_of(c: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of :data:`PEAK_TAGS` per rank from one file's rows, in O(rows): the highest value per rank,
    then the earliest step holding it."""
    ranks, row = _dense(c["rank"])
    out: list[dict[str, Any]] = [{"run": None, "rank": int(r)} for r in ranks]
    for column, tags in PEAK_TAGS.items():
        value = np.full(len(ranks), np.nan)
        step = np.zeros(len(ranks), dtype=np.int64)
        for tag in tags:  # the first present tag counts, per rank
            va = c["values"].get(tag)
            if va is None:
                continue
            mask = ~np.isnan(va) & np.isnan(value)[row]
            if not mask.any():
                continue
            r, st, va = row[mask], c["step"][mask], va[mask]
            high = np.full(len(ranks), -np.inf)
            np.maximum.at(high, r, va)
            at = va == high[r]
            first = np.full(len(ranks), np.iinfo(np.int64).max)
            np.minimum.at(first, r[at], st[at])
            got = np.isfinite(high)
            value[got] = to_bytes(tag, high[got])
            step[got] = first[got]
        for i, o in enumerate(out):
            have = not np.isnan(value[i])
            o[column] = float(value[i]) if have else None
            o[column + "_step"] = int(step[i]) if have else None
    return out


def _heat_of(parts: list[dict[str, Any]], columns: int) -> dict[str, Any]:
    """The heat map from each file's rows (:func:`_scan`): the first of :data:`HEAT_TAGS` any file has."""
    tag = next((t for t in HEAT_TAGS if any(t in p["values"] for p in parts)), None)
    if tag is None:
        return {"tag": None, "ranks": [], "steps": [], "values": []}
    sel = [~np.isnan(p["values"][tag]) if tag in p["values"] else np.zeros(len(p["rank"]), bool) for p in parts]
    rk = np.concatenate([p["rank"][m] for p, m in zip(parts, sel)])
    st = np.concatenate([p["step"][m] for p, m in zip(parts, sel)])
    va = np.concatenate([p["values"][tag][m] for p, m in zip(parts, sel) if tag in p["values"]])
    ranks, row = _dense(rk)
    steps = np.unique(st)
    pos = np.searchsorted(steps, st)
    bins = min(columns, len(steps))
    col = pos * bins // len(steps)
    grid = np.full((len(ranks), bins), -np.inf)
    np.maximum.at(grid, (row, col), va)
    last_step = np.zeros(bins, dtype=np.int64)
    np.maximum.at(last_step, col, st)
    values = to_bytes(tag, grid).tolist()
    if not np.isfinite(grid).all():  # a rank without a record in a bin: None
        values = [[v if v != -np.inf else None for v in line] for line in values]
    return {"tag": tag, "ranks": ranks.tolist(), "steps": last_step.tolist(), "values": values}


class JobTables:
    """Answers about compact jobs' rank tables, cached until a table file changes."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._compute = threading.Lock()  # one answer computed at a time; requests waiting take its result

    @staticmethod
    def has_tables(job_dir: str) -> bool:
        """Whether the job has rank tables."""
        return bool(rank_table_paths(job_dir))

    def _cached(self, key: tuple[Any, ...], job_dir: str, make: Any) -> Any:
        stamp = tuple((p, st.st_size, st.st_mtime_ns) for p in rank_table_paths(job_dir)
                      for st in [os.stat(p, follow_symlinks=False)])
        with self._compute:
            with self._lock:
                hit = self._cache.get(key)
            if hit is None or hit[0] != stamp:
                try:
                    value: Any = make()
                except RankTableError as exc:  # kept too: a hostile file costs its first request only
                    value = exc
                hit = (stamp, value)
                with self._lock:
                    if len(self._cache) > 64:
                        self._cache.clear()
                    self._cache[key] = hit
        if isinstance(hit[1], RankTableError):
            raise hit[1]
        return hit[1]

    def peaks(self, job_dir: str, root: str) -> list[dict[str, Any]]:
        """One row per rank: each peak in bytes and its step (:data:`tbmem._internal.plugin.runs.PEAK_TAGS`)."""
        return [dict(r) for r in self._cached(("view", job_dir), job_dir, lambda: self._view(job_dir, root))["peaks"]]

    def skipped(self, job_dir: str, root: str) -> list[dict[str, str]]:
        """The node files the last answers skipped: ``{"file", "error"}`` each."""
        return self._cached(("view", job_dir), job_dir, lambda: self._view(job_dir, root))["skipped"]

    def heatmap(self, job_dir: str, root: str, *, columns: int = 200) -> dict[str, Any]:
        """``{"tag", "ranks", "steps" (each bin's last step), "values" (bytes; rank x bin, None: no
        record)}``, each bin the highest value of its steps."""
        if columns == _COLUMNS:  # the tab's: computed with the peaks, in one read of the tables
            return self._cached(("view", job_dir), job_dir, lambda: self._view(job_dir, root))["heat"]
        return self._cached(("heat", job_dir, columns), job_dir,
                            lambda: _heat_of(list(_scan(job_dir, root, HEAT_TAGS, skipped=[])), columns))

    @staticmethod
    def _view(job_dir: str, root: str) -> dict[str, Any]:
        wanted = tuple(dict.fromkeys([*(t for tags in PEAK_TAGS.values() for t in tags), *HEAT_TAGS]))
        peaks: list[dict[str, Any]] = []
        heat = []
        skipped: list[dict[str, str]] = []
        for part in _scan(job_dir, root, wanted, skipped=skipped):  # a rank's rows are in one file: peaks file by file
            peaks.extend(_peaks_of(part))
            heat.append({"rank": part["rank"], "step": part["step"],
                         "values": {t: v for t, v in part["values"].items() if t in HEAT_TAGS}})
        return {"peaks": sorted(peaks, key=lambda r: r["rank"]), "heat": _heat_of(heat, _COLUMNS), "skipped": skipped}

    def rank_series(self, job_dir: str, root: str, rank: int) -> dict[str, Any]:
        """One rank's memory lines: ``{tag: {"steps": [...], "values": [bytes...]}}``."""
        return self._cached(("rank", job_dir, rank), job_dir, lambda: self._rank_series(job_dir, root, rank))

    @staticmethod
    def _rank_series(job_dir: str, root: str, rank: int) -> dict[str, Any]:
        out = {}
        for c in _scan(job_dir, root, _LINES, rank=rank):
            for tag, values in c["values"].items():
                mask = ~np.isnan(values)
                if mask.any():
                    order = np.argsort(c["step"][mask], kind="stable")
                    out[tag] = {"steps": c["step"][mask][order].tolist(),
                                "values": np.asarray(to_bytes(tag, values[mask][order]), dtype=float).tolist()}
        return {t: out[t] for t in _LINES if t in out}
