"""A synthetic compact job: RANKS ranks x RECORDS records, as tbmem's compact layout writes it.

    python benchmarks/synthetic_ranks.py LOGDIR [RANKS] [RECORDS]

Writes ``LOGDIR/job/rank0`` (rank 0's run: its records and the cross-rank aggregates, as
events, through :class:`tbmem.MemoryWriter`) and ``LOGDIR/job/ranks/node<n>.parquet`` (8 ranks
per node, 10 values per record, in :func:`tbmem._internal.logdir.rank_table.rank_table_schema`). Values: rank r's VRAM grows with the step, with a rank-dependent level; rank
``RANKS * 3 // 4`` holds 2 GB more from the middle of the run on (the one to find).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tbmem._internal.tags import TAGS

__all__ = ["build", "KEYS", "HOT_RANK"]

#: The readings of each record (10 values).
KEYS = ("vram_allocated", "vram_reserved", "vram_peak_allocated", "vram_peak_reserved", "ram_rss", "ram_tree_rss",
        "ram_tree_workers", "step_time", "cpu_percent", "ram_system_used")
PER_NODE = 8


def HOT_RANK(ranks: int) -> int:  # noqa: N802 - a constant of the job's size
    """The rank holding 2 GB more in the second half."""
    return ranks * 3 // 4


def _values(rank: int, records: int, hot: int) -> dict[str, np.ndarray]:
    """Raw readings (bytes, seconds, counts) of one rank's records."""
    rng = np.random.default_rng(rank)
    k = np.arange(records)
    base = (8 + (rank % 17) * 0.1) * 2**30 + k * 2**20 + rng.normal(0, 2**24, records)
    if rank == hot:
        base = base + np.where(k >= records // 2, 2 * 2**30, 0)
    return {"vram_allocated": base, "vram_reserved": base * 1.2, "vram_peak_allocated": base * 1.1,
            "vram_peak_reserved": base * 1.25, "ram_rss": 3 * 2**30 + rng.normal(0, 2**22, records),
            "ram_tree_rss": 4 * 2**30 + rng.normal(0, 2**22, records), "ram_tree_workers": np.full(records, 2.0),
            "step_time": 0.025 + rng.normal(0, 0.001, records), "cpu_percent": 100 + rng.normal(0, 5, records),
            "ram_system_used": 200 * 2**30 + rng.normal(0, 2**26, records)}


def build(logdir: str, ranks: int = 1000, records: int = 1000, every: int = 10) -> str:
    """Write the job; returns its folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tbmem import MemoryWriter
    from tbmem._internal.logdir.rank_table import rank_table_path, rank_table_schema
    from tbmem._internal.ranks.aggregate import aggregate_rows

    job = os.path.join(logdir, "job")
    hot = HOT_RANK(ranks)
    steps = np.arange(records, dtype=np.int64) * every
    tags = [TAGS[k].tag for k in KEYS]
    agg_keys = ("ram_rss", "ram_tree_rss", "vram_allocated", "vram_reserved", "vram_peak_allocated",
                "vram_peak_reserved", "step_time")
    gathered = np.empty((records, ranks, 1 + len(agg_keys)))
    rank0: dict[str, np.ndarray] = {}
    schema = rank_table_schema(tags)
    for node in range((ranks + PER_NODE - 1) // PER_NODE):
        members = range(node * PER_NODE, min((node + 1) * PER_NODE, ranks))
        parts = []
        for r in members:
            raw = _values(r, records, hot)
            if r == 0:
                rank0 = raw
            gathered[:, r, 0] = steps
            for j, key in enumerate(agg_keys):
                gathered[:, r, 1 + j] = raw[key]
            cols = {"rank": np.full(records, r, dtype=np.int32), "step": steps, "wall_time": np.full(records, 1.7e9)}
            cols.update({TAGS[k].tag: raw[k] / TAGS[k].scale for k in KEYS})  # in the tags' units
            parts.append(pa.table(cols, schema=schema))
        path = rank_table_path(job, str(node))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.concat_tables(parts), path, row_group_size=records)  # a row group per rank's flushes
    with MemoryWriter(os.path.join(job, "rank0"), census_every=0, flush_each_record=False) as w:
        for i, step in enumerate(steps.tolist()):
            w._write_readings({k: float(rank0[k][i]) for k in KEYS}, step)  # a record: raw readings
            values, reporting = aggregate_rows(gathered[i], agg_keys)
            values[TAGS["ranks_reporting"].tag] = float(reporting)
            w.write_scalars(values, step)
    return job


if __name__ == "__main__":
    args = sys.argv[1:]
    print(build(args[0], *(int(a) for a in args[1:3])))
