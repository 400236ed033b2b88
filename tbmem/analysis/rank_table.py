"""Every rank of a compact job, summarised by columnar queries over its Parquet rank tables.

A job written in the compact layout (docs/distributed.md) has TensorBoard runs for a few ranks
only; all its ranks' records are in ``<job>/ranks/node<n>.parquet``
(:mod:`tbmem.logdir.rank_table`). :func:`table_summaries` gives one :class:`RunSummary` per
rank from grouped aggregations in pyarrow (no Python loop over records), named
``<job>/rank<r>`` as a per-rank job's runs are, so :func:`tbmem.analysis.ranks.rank_jobs` and
``tbmem report`` treat both layouts alike. :func:`with_table_ranks` adds them to the summaries
of a logdir's event files; a rank that also has a run keeps the summary of its events (leaks
and census included).

Example:
    >>> import os, tempfile
    >>> from tbmem.logdir.rank_table import RankTableWriter
    >>> from tbmem.analysis.rank_table import table_summaries
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

import os
from typing import Any, Sequence

from tbmem._extras import require
from tbmem.analysis.summary import RunSummary
from tbmem.logdir.layout import RANK_DIR_PREFIX
from tbmem.logdir.rank_table import RANK_TABLE_DIR, read_rank_table

__all__ = ["compact_jobs", "table_summaries", "with_table_ranks"]

_PEAKS = {  # RunSummary field -> tags, the highest over them (as tbmem.analysis.summary reads events)
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
    pa = require("pyarrow", extra="ranks")
    pc = require("pyarrow.compute", extra="ranks")
    table = read_rank_table(job_dir, columns=["rank", "step", "tag", "value"])
    if table.num_rows == 0:
        return []
    tags = table.column("tag").combine_chunks()
    plain = tags.dictionary_decode() if pa.types.is_dictionary(tags.type) else tags
    table = table.set_column(table.schema.get_field_index("tag"), "tag", plain)
    memory = table.filter(pc.starts_with(table.column("tag"), "Memory/"))
    steps = memory.group_by("rank").aggregate([("step", "count_distinct"), ("step", "min"), ("step", "max")])
    wanted = sorted({t for group in _PEAKS.values() for t in group} | {_STEP_TIME})
    picked = table.filter(pc.is_in(table.column("tag"), value_set=pa.array(wanted)))
    stats = picked.group_by(["rank", "tag"]).aggregate(
        [("value", "max"), ("value", "mean"), ("value", "tdigest", pc.TDigestOptions(q=[0.5, 0.95]))])
    per_rank: dict[int, dict[str, tuple[float, float, list[float]]]] = {}
    cols = stats.to_pydict()
    for rank, tag, high, mean, quant in zip(cols["rank"], cols["tag"], cols["value_max"], cols["value_mean"],
                                           cols["value_tdigest"]):
        per_rank.setdefault(rank, {})[tag] = (high, mean, quant)
    out = []
    sc = steps.to_pydict()
    for rank, count, first, last in sorted(zip(sc["rank"], sc["step_count_distinct"], sc["step_min"], sc["step_max"])):
        have = per_rank.get(rank, {})
        fields: dict[str, Any] = {}
        for name, group in _PEAKS.items():
            found = max((have[t][0] for t in group if t in have), default=None)
            fields[name] = None if found is None else (int(found) if name == "max_tree_workers" else float(found))
        st = have.get(_STEP_TIME)
        step_time = None if st is None else {"mean": float(st[1]), "median": float(st[2][0]),
                                              "p95": float(st[2][1]), "max": float(st[0])}
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
