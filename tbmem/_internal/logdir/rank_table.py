"""The rank table of a compact job: every rank's records in one Apache Parquet file per node.

A job written in the compact layout (``RanksConfig(layout="compact")``, docs/distributed.md)
keeps TensorBoard runs for rank 0 and the ranks that matter only; every rank's records go
to ``<job>/ranks/node<n>.parquet``, one row per record, one column per tag::

    rank: int32   step: int64   wall_time: float64   <tag>: float64 (null: not in this record) ...

A reader reads only the columns of the tags it needs (the heat map of 1,000 ranks x 1,000
records reads 3 columns, not ten million tag-value rows). A tag seen for the first time adds
a column: the rows written before have it null.

The file is written by one process per node (the node's local rank 0, which receives its
peers' records: :mod:`tbmem._internal.ranks.compact`). Each flush appends one row group and replaces
the file atomically (a complete file is written beside it, then renamed over it), so a
reader always sees a whole file with every row group flushed so far: the file is readable
while the job runs. Rewriting costs the file's size at each flush, on the receiving thread.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.rank_table import RankTableWriter, rank_table_paths, read_rank_table
    >>> job = tempfile.mkdtemp()
    >>> table = RankTableWriter(os.path.join(job, "ranks", "node0.parquet"))
    >>> table.add(0, 10, 1.0, {"Memory/RAM/process_rss_GB": 1.5})
    >>> table.add(1, 10, 1.0, {"Memory/RAM/process_rss_GB": 2.5})
    >>> table.close()
    >>> [os.path.basename(p) for p in rank_table_paths(job)]
    ['node0.parquet']
    >>> read_rank_table(job).to_pydict()["Memory/RAM/process_rss_GB"]
    [1.5, 2.5]
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from typing import Any, Iterable, Iterator, Mapping

from tbmem._internal._extras import require
from tbmem._internal.logdir.safe_open import open_regular_below

__all__ = ["RANK_TABLE_DIR", "RANK_TABLE_FILE", "rank_table_path", "rank_table_paths", "RankTableWriter",
           "read_rank_table", "is_compact_job", "rank_table_schema", "rank_table_tags", "KEY_COLUMNS", "tag_problem"]

#: The folder of a compact job's rank tables, beside its ``rank<r>`` runs.
RANK_TABLE_DIR = "ranks"
#: One file per node: ``node<n>.parquet`` (``n``: torchrun's ``GROUP_RANK``, or the host's name).
RANK_TABLE_FILE = re.compile(r"^node(?P<node>[A-Za-z0-9_.-]+)\.parquet$")


def _pa() -> tuple[Any, Any]:
    return require("pyarrow", extra="ranks"), require("pyarrow.parquet", extra="ranks")


#: The columns of every row before the tags' columns.
KEY_COLUMNS = ("rank", "step", "wall_time")


#: The longest tag a column is made for.
MAX_TAG_CHARS = 512


def tag_problem(tag: Any) -> str | None:
    """Why ``tag`` cannot name a column of the table (None: it can).

    Example:
        >>> tag_problem("Memory/RAM/process_rss_GB"), tag_problem("step"), tag_problem(5)
        (None, 'a key column', 'not a string')
    """
    if not isinstance(tag, str):
        return "not a string"
    if tag in KEY_COLUMNS:
        return "a key column"
    if not tag or len(tag) > MAX_TAG_CHARS or not tag.isprintable():
        return f"empty, longer than {MAX_TAG_CHARS} characters or not printable"
    return None


def _report_tag(tag: Any, problem: str) -> None:
    from tbmem._internal._log import report_once

    report_once("ranks:table-tag", f"tbmem: a record for the rank table named the tag {str(tag)[:80]!r} "
                f"({problem}): that tag is dropped (said once)")


def rank_table_schema(tags: Iterable[str] = ()) -> Any:
    """The table's ``pyarrow.Schema`` with a column per tag in ``tags``."""
    pa, _ = _pa()
    return pa.schema([("rank", pa.int32()), ("step", pa.int64()), ("wall_time", pa.float64())]
                     + [(t, pa.float64()) for t in tags])


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


def _damaged(path: str, exc: BaseException, on_error: str) -> None:
    message = (f"tbmem: the rank table {path} cannot be read ({type(exc).__name__}: "
               f"{' '.join(str(exc).split())[:200]}); its node's ranks are left out, the other nodes are read")
    if on_error == "raise":
        raise ValueError(message) from exc
    from tbmem._internal._log import report_once

    report_once(f"ranks:table-damaged:{path}", message)


def rank_table_tags(job_dir: str, *, root: str | None = None, on_error: str = "warn") -> list[str]:
    """The tags with a column in some node's table (from the files' footers only); a damaged file is
    skipped with one line naming it (``on_error="raise"``: a ValueError naming it)."""
    _, pq = _pa()
    tags: dict[str, None] = {}
    for path in rank_table_paths(job_dir):
        fd, _ = open_regular_below(root or job_dir, path)
        with os.fdopen(fd, "rb") as fh:
            try:
                names = pq.read_schema(fh).names
            except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many
                _damaged(path, exc, on_error)
                continue
            tags.update((n, None) for n in names if n not in KEY_COLUMNS)
    return list(tags)


def read_rank_table(job_dir: str, *, columns: Iterable[str] | None = None, root: str | None = None,
                    on_error: str = "warn") -> Any:
    """Every node's rows as one ``pyarrow.Table``: the key columns and those of ``columns`` (every
    tag by default) a file has; a tag some file lacks is null in its rows.

    Args:
        job_dir: The job's folder. columns: The tags (and key columns) to read.
        root: The folder no symlink below may be followed (a server's logdir; default ``job_dir``).
        on_error: ``"warn"``: a node file that cannot be read is left out with one line naming it
            (the other nodes are read); ``"raise"``: a ValueError naming it.
    """
    pa, pq = _pa()
    tables = []
    for path in rank_table_paths(job_dir):
        # opened without following a symlink below the root (a server reads only inside its logdir)
        fd, _ = open_regular_below(root or job_dir, path)
        with os.fdopen(fd, "rb") as fh:
            try:
                source = pq.ParquetFile(fh)
                names = source.schema_arrow.names
                wanted = names if columns is None else [n for n in dict.fromkeys((*KEY_COLUMNS, *columns)) if n in names]
                tables.append(source.read(columns=wanted))
            except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many
                _damaged(path, exc, on_error)
    if not tables:
        return rank_table_schema([] if columns is None else [c for c in columns if c not in KEY_COLUMNS]).empty_table()
    return pa.concat_tables(tables, promote_options="default")


class RankTableWriter:
    """Appends records to one node's rank table; each :meth:`flush` adds a row group.

    Thread-safe: the node's receiving thread and its own rank add rows.

    Args:
        path: The table's file (:func:`rank_table_path`).
        flush_rows: Records buffered before :meth:`add` flushes.
    """

    def __init__(self, path: str, *, flush_rows: int = 20_000) -> None:
        _pa()  # the missing extra is named at once, not at the first flush
        self.path = path
        self.flush_rows = flush_rows
        self._lock = threading.Lock()
        self._rows: list[tuple[int, int, float, Mapping[str, float]]] = []
        self._blocks: list[tuple[int, tuple[str, ...], list[int], list[float], Any]] = []  # see add_block
        self._block_rows = 0
        self._tags: dict[str, None] = {}  # every tag written, in the order first seen: the file's columns
        self.rows = 0  # rows in the file
        self.row_groups = 0
        self.file_bytes = 0  # the file's size after the last flush

    def add(self, rank: int, step: int, wall_time: float, values: Mapping[str, float]) -> None:
        """One record of one rank: a row."""
        bad = [t for t in values if tag_problem(t) is not None]
        if bad:
            _report_tag(bad[0], tag_problem(bad[0]) or "")
            values = {t: v for t, v in values.items() if t not in bad}
        if not values:
            return
        with self._lock:
            self._rows.append((rank, step, wall_time, values))
            due = len(self._rows) >= self.flush_rows
        if due:
            self.flush()

    def add_block(self, rank: int, tags: tuple[str, ...], steps: list[int], walls: list[float], values: Any) -> None:
        """Records of one rank with the same tags, as columns: ``values`` is a float64 array of shape
        ``(len(steps), len(tags))`` (what a node's receiver decodes from its peers' batches at once)."""
        if not steps or not tags:
            return
        if getattr(values, "shape", None) != (len(steps), len(tags)):
            raise ValueError(f"values of shape {getattr(values, 'shape', None)} for {len(steps)} records of "
                             f"{len(tags)} tags")
        keep = [j for j, t in enumerate(tags) if tag_problem(t) is None and t not in tags[:j]]
        if len(keep) < len(tags):
            bad = next(t for j, t in enumerate(tags) if j not in keep)
            _report_tag(bad, tag_problem(bad) or "a tag twice")
            tags, values = tuple(tags[j] for j in keep), values[:, keep]
            if not tags:
                return
        with self._lock:
            self._blocks.append((rank, tags, steps, walls, values))
            self._block_rows += len(steps)
            due = len(self._rows) + self._block_rows >= self.flush_rows
        if due:
            self.flush()

    def pending(self) -> int:
        """Records not yet in the file."""
        with self._lock:
            return len(self._rows) + self._block_rows

    def flush(self) -> None:
        """Write the buffered records as one more row group (the file is replaced whole; a new tag
        widens every row group before it with a null column)."""
        pa, pq = _pa()
        with self._lock:
            rows, self._rows = self._rows, []
            blocks, self._blocks, self._block_rows = self._blocks, [], 0
            if not rows and not blocks:
                return
            for _, _, _, values in rows:
                for tag in values:
                    if tag not in self._tags:
                        self._tags[tag] = None
            for _, keys, _, _, _ in blocks:
                for tag in keys:
                    if tag not in self._tags:
                        self._tags[tag] = None
            tags = list(self._tags)
        schema = rank_table_schema(tags)
        parts = []
        if rows:
            data: dict[str, Any] = {"rank": [r[0] for r in rows], "step": [r[1] for r in rows],
                                    "wall_time": [r[2] for r in rows]}
            for tag in tags:
                data[tag] = [r[3].get(tag) for r in rows]
            parts.append(pa.table(data, schema=schema))
        for rank, keys, steps, walls, values in blocks:
            column = {tag: j for j, tag in enumerate(keys)}
            n = len(steps)
            arrays = [pa.array([rank] * n, pa.int32()), pa.array(steps, pa.int64()), pa.array(walls, pa.float64())]
            arrays += [pa.array(values[:, column[t]], pa.float64()) if t in column else pa.nulls(n, pa.float64())
                       for t in tags]
            parts.append(pa.Table.from_arrays(arrays, schema=schema))
        batch = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        table = os.path.basename(self.path)
        # two jobs in one logdir (or a restarted one) rewrite the same file: one at a time, under a lock
        # beside it; the file's columns are kept whoever wrote them
        with _locked(os.path.join(folder, f".{table}.lock")):
            _sweep(folder, table)
            temp = os.path.join(folder, f".tmp-{table}-{os.getpid()}-{uuid.uuid4().hex[:8]}.part")
            try:
                old = pq.ParquetFile(self.path) if os.path.exists(self.path) else None
                if old is not None:
                    extra = [n for n in old.schema_arrow.names if n not in KEY_COLUMNS and n not in schema.names]
                    if extra:
                        schema = rank_table_schema([*tags, *extra])
                        batch = _widen(batch, schema)
                with pq.ParquetWriter(temp, schema) as out:
                    if old is not None:
                        for i in range(old.num_row_groups):
                            out.write_table(_widen(old.read_row_group(i), schema))
                    out.write_table(batch, row_group_size=max(batch.num_rows, 1))
                os.replace(temp, self.path)
            finally:
                if os.path.exists(temp):
                    os.unlink(temp)
            self.file_bytes = os.path.getsize(self.path)
        self.rows += batch.num_rows
        self.row_groups += 1

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) for the block; none where flock is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: one writer per table, as before
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sweep(folder: str, table: str) -> None:
    """Remove what a writer of ``table`` killed mid-flush left (every writer makes its part under the
    lock, so under the lock any part of this table is left over; an older version's parts, named by
    pid only, once their process is gone and they are an hour old)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not (name.startswith(".tmp-") and name.endswith(".part")):
            continue
        left = name.startswith(f".tmp-{table}-")
        if not left:
            pid = name[5:].split("-")[0]
            try:
                left = pid.isdigit() and time.time() - entry.stat(follow_symlinks=False).st_mtime > 3600 and not _alive(int(pid))
            except OSError:
                continue
        if left:
            try:
                os.unlink(entry.path)
                from tbmem._internal._log import logger

                logger.info("tbmem: removed %s, left by a rank table's writer that ended mid-flush", entry.path)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _widen(table: Any, schema: Any) -> Any:
    """``table`` with ``schema``'s columns, null where it had none."""
    pa, _ = _pa()
    cols = [table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)
