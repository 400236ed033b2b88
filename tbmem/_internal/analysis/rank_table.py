"""Every rank of a compact job, summarised by columnar queries over its Parquet rank tables.

A job written in the compact layout (docs/distributed.md) has TensorBoard runs for a few ranks
only; all its ranks' records are in ``<job>/ranks/node<n>.parquet``
(:mod:`tbmem._internal.logdir.rank_table`). :func:`table_summaries` gives one :class:`RunSummary` per
rank from grouped aggregations in pyarrow (no Python loop over records), named
``<job>/rank<r>`` as a per-rank job's runs are, so :func:`tbmem.analysis.rank_jobs` and
``tbmem report`` treat both layouts alike. :func:`with_table_ranks` adds them to the summaries
of a logdir's event files; a rank that also has a run keeps the summary of its events (leaks
and census included).

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.rank_table import RankTableWriter
    >>> from tbmem._internal.analysis.rank_table import table_summaries
    >>> logdir = tempfile.mkdtemp()
    >>> table = RankTableWriter(os.path.join(logdir, "job", "ranks", "node0.parquet"))
    >>> for rank in range(3):
    ...     for step in range(4):
    ...         table.add(rank, step, 0.0, {"Memory/RAM/process_rss_GB": rank + step / 10})
    >>> table.close()
    >>> [(s.run, s.records, s.peak_rss_gb) for s in table_summaries(os.path.join(logdir, "job"), "job")]
    [('job/rank0', 4, 0.3), ('job/rank1', 4, 1.3), ('job/rank2', 4, 2.3)]
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

from tbmem._internal._extras import require
from tbmem._internal.analysis.summary import RunSummary
from tbmem._internal.logdir.layout import RANK_DIR_PREFIX
from tbmem._internal.logdir.rank_table import RANK_TABLE_DIR, rank_table_tags, read_rank_table

__all__ = ["compact_jobs", "table_summaries", "with_table_ranks"]

_PEAKS = {  # RunSummary field -> tags, the highest over them (as tbmem._internal.analysis.summary reads events)
    "peak_allocated_gb": ("Memory/GPU/vram_peak_allocated_GB", "Memory/GPU/vram_allocated_GB"),
    "peak_reserved_gb": ("Memory/GPU/vram_peak_reserved_GB", "Memory/GPU/vram_reserved_GB"),
    "peak_rss_gb": ("Memory/RAM/process_peak_rss_GB", "Memory/RAM/process_rss_GB"),
    "peak_tree_rss_gb": ("Memory/RAM/process_tree_rss_GB",),
    "max_tree_workers": ("Memory/RAM/process_tree_workers",),
    "max_fragmentation_percent": ("Memory/fragmentation_percent",),
}
_STEP_TIME = "Perf/step_time_ms"


def compact_jobs(logdir: str) -> dict[str, str]:
    """``{job name: job folder}`` of every compact job below ``logdir`` (the job's name is its
    folder relative to ``logdir``, ``"."`` for ``logdir`` itself)."""
    root = os.path.abspath(logdir)
    jobs = {}
    for folder, dirs, _ in os.walk(root):
        if RANK_TABLE_DIR in dirs and any(n.endswith(".parquet") for n in os.listdir(os.path.join(folder, RANK_TABLE_DIR))):
            jobs[os.path.relpath(folder, root).replace(os.sep, "/")] = folder
        # a run's own folders (plugins/, rank<r>/) hold no job: do not walk a thousand of them
        dirs[:] = [d for d in dirs if d != RANK_TABLE_DIR and d != "plugins" and not d.startswith(RANK_DIR_PREFIX)]
    return jobs


def _run_name(job: str, rank: int) -> str:
    return f"{RANK_DIR_PREFIX}{rank}" if job == "." else f"{job}/{RANK_DIR_PREFIX}{rank}"


def table_summaries(job_dir: str, job: str) -> list[RunSummary]:
    """One :class:`RunSummary` per rank of the job's rank tables: records, peaks, step times."""
    pc = require("pyarrow.compute", extra="ranks")
    tags = rank_table_tags(job_dir)
    memory = [t for t in tags if t.startswith("Memory/")]
    wanted = [t for t in dict.fromkeys([*(t for g in _PEAKS.values() for t in g), _STEP_TIME]) if t in tags]
    table = read_rank_table(job_dir, columns=["rank", "step", *dict.fromkeys([*memory, *wanted])])
    if table.num_rows == 0 or not memory:
        return []
    # a record: a row with some memory reading (a write_scalars of other tags is not one)
    no_memory = functools.reduce(pc.and_, (pc.is_null(table.column(t)) for t in memory))
    records = table.filter(pc.invert(no_memory))
    steps = records.group_by("rank").aggregate([("step", "count_distinct"), ("step", "min"), ("step", "max")])
    aggs = [(t, "max") for t in wanted] + ([(_STEP_TIME, "mean"), (_STEP_TIME, "tdigest", pc.TDigestOptions(q=[0.5, 0.95]))]
                                           if _STEP_TIME in tags else [])
    stats = table.group_by("rank").aggregate(aggs).to_pydict() if aggs else {"rank": []}
    per_rank = {r: i for i, r in enumerate(stats["rank"])}
    out = []
    sc = steps.to_pydict()
    for rank, count, first, last in sorted(zip(sc["rank"], sc["step_count_distinct"], sc["step_min"], sc["step_max"])):
        i = per_rank.get(rank)
        fields: dict[str, Any] = {}
        for name, group in _PEAKS.items():
            found = [v for t in group if t in wanted and i is not None and (v := stats[f"{t}_max"][i]) is not None]
            high = max(found, default=None)
            fields[name] = None if high is None else (int(high) if name == "max_tree_workers" else float(high))
        step_time = None
        if i is not None and _STEP_TIME in tags and stats[f"{_STEP_TIME}_mean"][i] is not None:
            q = stats[f"{_STEP_TIME}_tdigest"][i]
            step_time = {"mean": float(stats[f"{_STEP_TIME}_mean"][i]), "median": float(q[0]), "p95": float(q[1]),
                         "max": float(stats[f"{_STEP_TIME}_max"][i])}
        out.append(RunSummary(run=_run_name(job, rank), first_step=int(first), last_step=int(last),
                              records=int(count), step_time_ms=step_time, **fields))
    return out


def with_table_ranks(logdir: str, summaries: Sequence[RunSummary], *,
                     jobs: dict[str, str] | None = None) -> list[RunSummary]:
    """``summaries`` plus one per rank of each compact job below ``logdir`` that has no run of its own."""
    jobs = compact_jobs(logdir) if jobs is None else jobs
    if not jobs:
        return list(summaries)
    have = {s.run for s in summaries}
    extra: list[RunSummary] = []
    for job, folder in sorted(jobs.items()):
        extra.extend(s for s in table_summaries(folder, job) if s.run not in have)
    return list(summaries) + extra
