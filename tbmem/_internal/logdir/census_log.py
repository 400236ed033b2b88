"""The census of each step as one JSON line in ``<run>/plugins/tbmem/census.jsonl``.

TensorBoard keeps only 10 text summaries per tag by default (its reservoir), so the
markdown table of the largest tensors (text tag ``Memory/Large_Tensors/top_k``) is
gone for most censuses of a long run. MemoryWriter therefore also appends every
census, with exact byte counts and its top-K storages, to this side file, which the
Memory tab reads. Lines are appended with one ``write`` each; a restarted run that
writes a step again replaces it (the last line of a step wins, as in TensorBoard).

The file is opened below the run directory without following a symlink (a logdir may be
shared: a planted ``census.jsonl`` link must not make training append to someone's file),
and a line the disk cut short is removed again, so the next line stays readable. The
reader reads only what was appended since its last call, in bounded pieces (a line over
:data:`MAX_LINE` bytes is skipped, never held whole), and returns only the fields a
census line has.

For logs written before the side file existed (its version 0 in
:data:`tbmem._internal.logdir.layout.FORMATS`), :func:`parse_census_markdown` reads the rows back from the
markdown table; ``tbmem report``'s hints read that table through it too.

The writer half (:func:`census_record`, :func:`append_census`) runs in the training process;
the reader half (:class:`CensusLog`, :func:`parse_census_markdown`) in the Memory tab and the
notebook. Neither imports torch.

Example:
    >>> import tempfile
    >>> from tbmem._internal.census.report import Census, TensorRecord
    >>> from tbmem._internal.logdir.census_log import CensusLog, append_census, census_log_path
    >>> run = tempfile.mkdtemp()
    >>> rec = TensorRecord(name="fc.weight", category="parameters", shape=(256, 1024),
    ...                    dtype="float32", device="cpu", bytes=2**20, module="model.fc")
    >>> append_census(run, 7, Census.from_records([rec], large_tensor_bytes=2**20, top_k=5))
    >>> CensusLog().read(census_log_path(run))[7]["top"][0]["name"]
    'fc.weight'
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from typing import Any, Callable

from tbmem._internal._log import report_once
from tbmem._internal.logdir.layout import CENSUS_LOG, census_log_path
from tbmem._internal.logdir.safe_open import append_line, open_below, open_regular_below

# CENSUS_LOG and census_log_path are tbmem._internal.logdir.layout's, here beside the format they name
__all__ = ["CENSUS_LOG", "census_log_path", "census_record", "append_census", "CensusLog",
           "parse_census_markdown", "MAX_LINE", "MAX_READ"]


def census_record(step: int, census: Any) -> dict[str, Any]:
    """One census (a :class:`tbmem.Census`) as a plain JSON-able dict, bytes exact."""
    return {
        "step": int(step), "wall_time": time.time(), "total_bytes": int(census.total_bytes),
        "storages": len(census.records), "by_category": dict(census.by_category),
        "by_dtype": dict(census.by_dtype), "by_device": dict(census.by_device),
        "by_module": dict(census.by_module), "unattributed_bytes": census.unattributed_bytes,
        "large_tensor_bytes": int(census.large_tensor_bytes), "large_count": census.large_count,
        "large_total_bytes": int(census.large_total_bytes), "duration_ms": census.duration_s * 1e3,
        "heap_scan": census.heap_scan, "notes": list(census.notes), "top_k": census.top_k,
        "where": getattr(census, "where", ""), "large_rule": getattr(census, "large_rule", ""),
        "top": [{"name": r.name, "category": r.category, "shape": list(r.shape), "dtype": r.dtype,
                 "device": r.device, "bytes": int(r.bytes), "module": r.module}
                for r in census.records[: census.top_k]],
    }


# json.dumps(separators=(",", ":"), allow_nan=False) makes this encoder at every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
#: Longest census line the reader keeps (a line is a few KiB: the top-K rows); longer ones are skipped.
MAX_LINE = 8 << 20
#: Most bytes one :meth:`CensusLog.read` reads; the rest waits for the next call.
MAX_READ = 64 << 20
_CHUNK = 1 << 20


def append_census(run_dir: str, step: int, census: Any,
                  on_os_error: Callable[[str, OSError], Any] | None = None) -> None:
    """Append one census to the run's side file; a failure is reported once, never raised.

    Args:
        run_dir: The run's log directory.
        step: The census's step.
        census: A :class:`tbmem.Census`.
        on_os_error: Called with (folder, error) when the disk refuses the line (a MemoryWriter
            counts it with its other dropped writes); None reports it once on the tbmem logger.
    """
    path = census_log_path(run_dir)
    where = os.path.dirname(path)
    try:
        line = (_ENCODER.encode(census_record(step, census)) + "\n").encode("utf-8")
        try:  # no symlink followed below the run directory; the umask decides the mode, as for events
            fd = open_below(run_dir, path, _APPEND, 0o666, make_dirs=True)
        except OSError as exc:
            link = _symlink_below(run_dir, path) if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
            if link is not None:
                where = link
                raise OSError(exc.errno, "it is a symlink, which tbmem does not follow") from None
            raise
        try:
            append_line(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        if on_os_error is not None:
            on_os_error(where, exc)
        else:
            report_once("census-log", "tbmem: could not append the census to plugins/tbmem/census.jsonl; "
                                      "the Memory tab will show the largest tensors of fewer censuses", exc=exc)
    except (ValueError, TypeError) as exc:
        report_once("census-log", "tbmem: could not encode the census for plugins/tbmem/census.jsonl; "
                                  "the Memory tab will show the largest tensors of fewer censuses", exc=exc)


def _symlink_below(root: str, path: str) -> str | None:
    """The first symlink on the way from ``root`` down to ``path``, if any."""
    here = root
    for name in os.path.relpath(path, root).split(os.sep):
        here = os.path.join(here, name)
        if os.path.islink(here):
            return here
    return None


class _File:
    """What a :class:`CensusLog` knows of one file."""

    __slots__ = ("lock", "key", "offset", "skipping", "records")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple[int, int] | None = None  # (st_dev, st_ino)
        self.offset = 0  # the first byte not yet parsed
        self.skipping = False  # inside a line longer than MAX_LINE
        self.records: dict[int, dict[str, Any]] = {}


class CensusLog:
    """Reads census side files incrementally: each call parses only the lines appended since.

    Thread-safe; one instance serves every run, and a call for one file never waits for
    another file. A file that shrank or was replaced is read afresh, a last line without its
    newline (being written) is left for the next call, a damaged line is skipped. Memory per
    call is bounded (:data:`MAX_LINE` plus 1 MiB), and so are the bytes read (:data:`MAX_READ`).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "census.jsonl")
        >>> with open(path, "w") as fh:
        ...     _ = fh.write('{"step": 4, "total_bytes": 64}\\n{"step": 8, "tot')
        >>> sorted(CensusLog().read(path))
        [4]
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}

    def read(self, path: str, *, root: str | None = None) -> dict[int, dict[str, Any]]:
        """Step -> census record of the file at ``path`` ({} when it does not exist or is no regular file).

        ``root``: the folder ``path`` must stay in; no symlink below it is followed
        (:func:`tbmem._internal.logdir.safe_open.open_below`). Without it only the file itself is not.
        """
        with self._lock:
            state = self._files.setdefault(path, _File())
        with state.lock:
            try:
                fd, st = open_regular_below(root or os.path.dirname(path) or ".", path)
            except OSError:
                return {}
            try:
                if state.key != (st.st_dev, st.st_ino) or st.st_size < state.offset:
                    state.key, state.offset, state.skipping, state.records = (st.st_dev, st.st_ino), 0, False, {}
                if st.st_size > state.offset:
                    _advance(fd, state, st.st_size)
            except OSError:
                pass  # what was read stays; the rest is tried again next time
            finally:
                os.close(fd)
            return state.records


def _advance(fd: int, state: _File, size: int) -> None:
    """Parse the complete lines from ``state.offset`` on (at most MAX_READ bytes)."""
    records: dict[int, dict[str, Any]] | None = None
    end = min(size, state.offset + MAX_READ)
    pos = state.offset
    pending = b""
    while pos < end:
        chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        if state.skipping:  # the rest of an over-long line
            cut = chunk.find(b"\n")
            if cut < 0:
                state.offset = pos
                continue
            state.skipping = False
            chunk = chunk[cut + 1:]
            state.offset = pos - len(chunk)
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if cut:
            for line in pending[:cut].splitlines():
                rec = _parse_line(line)
                if rec is not None:
                    if records is None:
                        records = dict(state.records)  # callers may hold the previous dict
                    records[rec["step"]] = rec
            state.offset += cut
            pending = pending[cut:]
        if len(pending) > MAX_LINE:
            state.skipping, state.offset, pending = True, pos, b""
    if records is not None:
        state.records = records


# the fields census_record writes: nothing else of a line is returned
_FIELDS = frozenset(("step", "wall_time", "total_bytes", "storages", "by_category", "by_dtype", "by_device",
                     "by_module", "unattributed_bytes", "large_tensor_bytes", "large_count",
                     "large_total_bytes", "duration_ms", "heap_scan", "notes", "top_k", "where",
                     "large_rule", "top"))
_LINE_START = b'{"step":'


def _parse_line(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        # a line cut short (a full disk, a killed writer) that the next line continued: the next
        # line is behind its start (census_record writes "step" first)
        start = line.rfind(_LINE_START)
        if start <= 0:
            return None
        return _parse_line(line[start:])
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
        return None
    return {k: v for k, v in rec.items() if k in _FIELDS}


_ROW = re.compile(r"^\|\s*(\d+)\s*\|(.*)\|\s*$")
_MB = 2.0**20


def _cells(body: str) -> list[str]:
    # split on | not preceded by a backslash (the census escapes | in names as \|)
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def parse_census_markdown(text: str) -> list[dict[str, Any]]:
    """The rows of the census's markdown table (``Census.to_markdown``); bytes from its MB column.

    The table rounds to 0.001 MB, so ``bytes`` is approximate here (``approx: True``);
    the side file has exact bytes.
    """
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        cells = _cells(m.group(2))
        if len(cells) != 6:
            continue
        name, category, shape, dtype, device, mb = cells
        try:
            nbytes = float(mb) * _MB
        except ValueError:
            continue
        dims = [] if shape == "scalar" else [int(d) for d in shape.split("x") if d.isdigit()]
        rows.append({"name": name.strip("`"), "category": category, "shape": dims, "dtype": dtype,
                     "device": device, "bytes": round(nbytes), "module": None, "approx": True})
    return rows
