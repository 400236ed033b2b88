"""The rank table of a compact job: every rank's records in one Apache Parquet file per node.

A job written in the compact layout (``RanksConfig(layout="compact")``, docs/distributed.md)
keeps TensorBoard runs for rank 0 and the ranks that matter only; every rank's records go
to ``<job>/ranks/node<n>.parquet``, one row per value::

    rank: int32   step: int64   wall_time: float64   tag: string (dictionary)   value: float64

The file is written by one process per node (the node's local rank 0, which receives its
peers' records: :mod:`tbmem.ranks.compact`). Each flush appends one row group and replaces
the file atomically (a complete file is written beside it, then renamed over it), so a
reader always sees a whole file with every row group flushed so far: the file is readable
while the job runs. Rewriting costs the file's size at each flush, on the receiving thread.

Example:
    >>> import os, tempfile
    >>> from tbmem.logdir.rank_table import RankTableWriter, rank_table_paths, read_rank_table
    >>> job = tempfile.mkdtemp()
    >>> table = RankTableWriter(os.path.join(job, "ranks", "node0.parquet"))
    >>> table.add(0, 10, 1.0, {"Memory/RAM/process_rss_GB": 1.5})
    >>> table.add(1, 10, 1.0, {"Memory/RAM/process_rss_GB": 2.5})
    >>> table.close()
    >>> [os.path.basename(p) for p in rank_table_paths(job)]
    ['node0.parquet']
    >>> read_rank_table(job).to_pydict()["value"]
    [1.5, 2.5]
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from typing import Any, Mapping

from tbmem._extras import require
from tbmem.logdir.safe_open import open_regular_below

__all__ = ["RANK_TABLE_DIR", "RANK_TABLE_FILE", "rank_table_path", "rank_table_paths", "RankTableWriter",
           "read_rank_table", "is_compact_job", "rank_table_schema"]

#: The folder of a compact job's rank tables, beside its ``rank<r>`` runs.
RANK_TABLE_DIR = "ranks"
#: One file per node: ``node<n>.parquet`` (``n``: torchrun's ``GROUP_RANK``, or the host's name).
RANK_TABLE_FILE = re.compile(r"^node(?P<node>[A-Za-z0-9_.-]+)\.parquet$")


def _pa() -> tuple[Any, Any]:
    return require("pyarrow", extra="ranks"), require("pyarrow.parquet", extra="ranks")


def rank_table_schema() -> Any:
    """The table's ``pyarrow.Schema``."""
    pa, _ = _pa()
    return pa.schema([("rank", pa.int32()), ("step", pa.int64()), ("wall_time", pa.float64()),
                      ("tag", pa.dictionary(pa.int32(), pa.string())), ("value", pa.float64())])


def rank_table_path(job_dir: str, node: str) -> str:
    """``<job_dir>/ranks/node<node>.parquet``."""
    name = f"node{re.sub(r'[^A-Za-z0-9_.-]', '_', node)}.parquet"
    return os.path.join(job_dir, RANK_TABLE_DIR, name)


def rank_table_paths(job_dir: str) -> list[str]:
    """The job's rank tables, sorted by name (none: the job was written per rank)."""
    folder = os.path.join(job_dir, RANK_TABLE_DIR)
    try:
        names = sorted(n for n in os.listdir(folder) if RANK_TABLE_FILE.match(n))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names]


def is_compact_job(job_dir: str) -> bool:
    """Whether ``job_dir`` holds rank tables (a job written in the compact layout)."""
    return bool(rank_table_paths(job_dir))


def read_rank_table(job_dir: str, *, columns: list[str] | None = None, root: str | None = None,
                    filters: Any = None) -> Any:
    """Every node's rows as one ``pyarrow.Table`` (empty, with the schema, when there are none).

    Args:
        job_dir: The job's folder. columns: The columns to read (all by default).
        root: The folder no symlink below may be followed (a server's logdir; default ``job_dir``).
        filters: pyarrow's row filters (``[("tag", "in", [...])]``): row groups are skipped by statistics.
    """
    pa, pq = _pa()
    tables = []
    for path in rank_table_paths(job_dir):
        # opened without following a symlink below the root (a server reads only inside its logdir)
        fd, _ = open_regular_below(root or job_dir, path)
        with os.fdopen(fd, "rb") as fh:
            tables.append(pq.read_table(fh, columns=columns, filters=filters))
    if not tables:
        schema = rank_table_schema()
        return schema.empty_table() if columns is None else schema.empty_table().select(columns)
    # each file's dictionary differs: unify them, then one table
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


class RankTableWriter:
    """Appends rows to one node's rank table; each :meth:`flush` adds a row group.

    Thread-safe: the node's receiving thread and its own rank add rows.

    Args:
        path: The table's file (:func:`rank_table_path`).
        flush_rows: Rows buffered before :meth:`add` flushes.
    """

    def __init__(self, path: str, *, flush_rows: int = 200_000) -> None:
        _pa()  # the missing extra is named at once, not at the first flush
        self.path = path
        self.flush_rows = flush_rows
        self._lock = threading.Lock()
        self._cols: dict[str, list[Any]] = {"rank": [], "step": [], "wall_time": [], "tag": [], "value": []}
        self.rows = 0  # rows in the file
        self.row_groups = 0

    def add(self, rank: int, step: int, wall_time: float, values: Mapping[str, float]) -> None:
        """One record of one rank: a row per value."""
        n = len(values)
        if not n:
            return
        with self._lock:
            c = self._cols
            c["rank"].extend([rank] * n)
            c["step"].extend([step] * n)
            c["wall_time"].extend([wall_time] * n)
            c["tag"].extend(values.keys())
            c["value"].extend(values.values())
            due = len(c["value"]) >= self.flush_rows
        if due:
            self.flush()

    def pending(self) -> int:
        """Rows not yet in the file."""
        with self._lock:
            return len(self._cols["value"])

    def flush(self) -> None:
        """Write the buffered rows as one more row group (the file is replaced whole)."""
        pa, pq = _pa()
        with self._lock:
            cols = self._cols
            if not cols["value"]:
                return
            self._cols = {k: [] for k in cols}
        schema = rank_table_schema()
        batch = pa.table({"rank": pa.array(cols["rank"], pa.int32()), "step": pa.array(cols["step"], pa.int64()),
                          "wall_time": pa.array(cols["wall_time"], pa.float64()),
                          "tag": pa.array(cols["tag"], pa.string()).dictionary_encode(),
                          "value": pa.array(cols["value"], pa.float64())}).cast(schema)
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}.part")
        try:
            with pq.ParquetWriter(temp, schema) as out:
                if os.path.exists(self.path):
                    old = pq.ParquetFile(self.path)
                    for i in range(old.num_row_groups):
                        out.write_table(old.read_row_group(i).cast(schema))
                out.write_table(batch, row_group_size=max(batch.num_rows, 1))
            os.replace(temp, self.path)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        self.rows += batch.num_rows
        self.row_groups += 1

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()
