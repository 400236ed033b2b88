"""The census of each step as one JSON line in ``<run>/plugins/tbmem/census.jsonl``.

TensorBoard keeps only 10 text summaries per tag by default (its reservoir), so the
markdown table of the largest tensors (text tag ``Memory/Large_Tensors/top_k``) is
gone for most censuses of a long run. MemoryWriter therefore also appends every
census, with exact byte counts and its top-K storages, to this side file, which the
Memory tab reads. Lines are appended with one ``write`` each; a restarted run that
writes a step again replaces it (the last line of a step wins, as in TensorBoard).

For logs written before the side file existed, :func:`parse_census_markdown` reads
the rows back from the markdown table.

Example:
    >>> import tempfile
    >>> from tbmem.census.report import Census, TensorRecord
    >>> from tbmem.plugin.census_log import CensusLog, append_census, census_log_path
    >>> run = tempfile.mkdtemp()
    >>> rec = TensorRecord(name="fc.weight", category="parameters", shape=(256, 1024),
    ...                    dtype="float32", device="cpu", bytes=2**20, module="model.fc")
    >>> append_census(run, 7, Census.from_records([rec], large_tensor_bytes=2**20, top_k=5))
    >>> CensusLog().read(census_log_path(run))[7]["top"][0]["name"]
    'fc.weight'
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Callable

from tbmem._log import report_once

__all__ = ["CENSUS_LOG", "census_log_path", "census_record", "append_census", "CensusLog",
           "parse_census_markdown"]

#: Path of the side file inside a run directory.
CENSUS_LOG = os.path.join("plugins", "tbmem", "census.jsonl")


def census_log_path(run_dir: str) -> str:
    """The census side file of a run directory."""
    return os.path.join(run_dir, CENSUS_LOG)


def census_record(step: int, census: Any) -> dict[str, Any]:
    """One census (a :class:`tbmem.census.Census`) as a plain JSON-able dict, bytes exact."""
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
# Folders made (or found) once: os.makedirs costs three system calls and an exception per census.
_FOLDERS_MADE: set[str] = set()


def append_census(run_dir: str, step: int, census: Any,
                  on_os_error: Callable[[str, OSError], Any] | None = None) -> None:
    """Append one census to the run's side file; a failure is reported once, never raised.

    Args:
        run_dir: The run's log directory.
        step: The census's step.
        census: A :class:`tbmem.census.Census`.
        on_os_error: Called with (folder, error) when the disk refuses the line (a MemoryWriter
            counts it with its other dropped writes); None reports it once on the tbmem logger.
    """
    path = census_log_path(run_dir)
    folder = os.path.dirname(path)
    try:
        line = _ENCODER.encode(census_record(step, census)) + "\n"
        if folder not in _FOLDERS_MADE:
            os.makedirs(folder, exist_ok=True)
            _FOLDERS_MADE.add(folder)
        try:
            fd = os.open(path, _APPEND, 0o666)  # the umask decides, as for events
        except FileNotFoundError:  # the folder was removed since this process made it: made again
            os.makedirs(folder, exist_ok=True)
            fd = os.open(path, _APPEND, 0o666)
        try:
            os.write(fd, line.encode("utf-8"))  # one write: concurrent appenders never interleave lines
        finally:
            os.close(fd)
    except OSError as exc:
        if on_os_error is not None:
            on_os_error(folder, exc)
        else:
            report_once("census-log", "tbmem: could not append the census to plugins/tbmem/census.jsonl; "
                                      "the Memory tab will show the largest tensors of fewer censuses", exc=exc)
    except (ValueError, TypeError) as exc:
        report_once("census-log", "tbmem: could not encode the census for plugins/tbmem/census.jsonl; "
                                  "the Memory tab will show the largest tensors of fewer censuses", exc=exc)


class CensusLog:
    """Reads census side files incrementally: each call parses only the lines appended since.

    Thread-safe; one instance serves every run. A file that shrank (rewritten) is read afresh,
    a last line without its newline (being written) is left for the next call, a damaged line
    is skipped.

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
        self._state: dict[str, tuple[int, int, dict[int, dict[str, Any]]]] = {}  # path -> (ino, offset, by step)

    def read(self, path: str) -> dict[int, dict[str, Any]]:
        """Step -> census record of the file at ``path`` ({} when it does not exist)."""
        try:
            st = os.stat(path)
        except OSError:
            return {}
        with self._lock:
            ino, offset, records = self._state.get(path, (st.st_ino, 0, {}))
            if ino != st.st_ino or st.st_size < offset:
                offset, records = 0, {}
            if st.st_size > offset:
                records = dict(records)
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read(st.st_size - offset)
                end = chunk.rfind(b"\n") + 1
                for line in chunk[:end].splitlines():
                    rec = _parse_line(line)
                    if rec is not None:
                        records[rec["step"]] = rec
                offset += end
            self._state[path] = (st.st_ino, offset, records)
            return records


def _parse_line(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
        return None
    return rec


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
