"""Profile traces of a run, ``plugins/tbmem/traces/step<s>/rank<r>.pt.trace.json.gz``: writer and reader halves.

Each window has a folder of its own holding one file per rank and nothing else: the layout
Holistic Trace Analysis takes (``TraceAnalysis(trace_dir=...)`` reads every ``.json.gz`` of a folder as
one rank's trace, the rank from its ``distributedInfo``), and torch-tb-profiler shows each window
folder as a run with a worker per rank. A window is named by its listing name,
``trace_rank<r>_step<s>.pt.trace.json.gz`` (:func:`trace_name`), which is also where traces were
written before (version 1, directly in ``plugins/tbmem/``): those are still listed and read.

A trace is a Chrome trace-event document (``{"traceEvents": [...], ...}``, gzip'd JSON) that Perfetto
and ``chrome://tracing`` open: what :mod:`tbmem._internal.profile` writes at the end of a profile window
(torch.profiler's events with tbmem's tracks merged in) and what ``tbmem trace`` writes from a logdir.
A window's trace also holds a ``"tbmem"`` key (ignored by trace viewers): the window's steps, its
clock alignment and the offline summary the Memory tab shows. Both halves open files through
:mod:`tbmem._internal.logdir.safe_open`: no symlink below the run is followed, and a reader reads at most
:data:`MAX_BYTES` compressed and :data:`MAX_JSON_BYTES` uncompressed.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.traces import list_traces, read_trace, trace_name, write_trace
    >>> run = tempfile.mkdtemp()
    >>> trace_name(rank=0, step=40)
    'trace_rank0_step000000040.pt.trace.json.gz'
    >>> _ = write_trace(run, trace_name(rank=0, step=40), {"traceEvents": [], "tbmem": {"steps": [40]}})
    >>> [(t["rank"], t["step"]) for t in list_traces(run)], read_trace(run, trace_name(rank=0, step=40))["tbmem"]
    ([(0, 40)], {'steps': [40]})
    >>> os.path.relpath(trace_path(run, trace_name(rank=0, step=40)), run)
    'plugins/tbmem/traces/step000000040/rank0.pt.trace.json.gz'

"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from typing import Any, Mapping

from tbmem._internal.logdir.layout import PLUGIN_DIR
from tbmem._internal.logdir.safe_open import open_below, open_regular_below

__all__ = ["TRACE_FILE", "TRACES_DIR", "MAX_BYTES", "MAX_JSON_BYTES", "trace_name", "trace_path", "window_dir",
           "encode_trace", "write_trace", "list_traces", "read_trace", "read_trace_fd"]

#: A profile window's listing name: the step its window starts at, 9 digits at least (as snapshots).
TRACE_FILE = re.compile(r"^trace_rank(?P<rank>\d+)_step(?P<step>\d{9,})\.pt\.trace\.json\.gz$")
#: The windows' folders, below the run's plugin folder: ``traces/step<s>/rank<r>.pt.trace.json.gz``.
TRACES_DIR = "traces"
_WINDOW_DIR = re.compile(r"^step(?P<step>\d{9,})$")
_RANK_FILE = re.compile(r"^rank(?P<rank>\d+)\.pt\.trace\.json\.gz$")
#: The most of a trace file a reader reads (gzip'd) and the most JSON it inflates.
MAX_BYTES = 256 * 2**20
MAX_JSON_BYTES = 1024 * 2**20
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def trace_name(*, rank: int, step: int) -> str:
    """The file name of the trace of the window that starts at ``step`` on ``rank``."""
    return f"trace_rank{rank}_step{step:09d}.pt.trace.json.gz"


def window_dir(run_dir: str, step: int) -> str:
    """The folder of the window that starts at ``step``: every rank's trace of it, nothing else (HTA's input)."""
    return os.path.join(run_dir, PLUGIN_DIR, TRACES_DIR, f"step{step:09d}")


def trace_path(run_dir: str, name: str) -> str:
    """Where trace ``name`` (a :data:`TRACE_FILE` name) of a run directory is: its window's folder, or
    ``plugins/tbmem/`` itself for a trace written there before (version 1)."""
    m = TRACE_FILE.match(name)
    if m is None:
        return os.path.join(run_dir, PLUGIN_DIR, name)
    path = os.path.join(window_dir(run_dir, int(m.group("step"))), f"rank{int(m.group('rank'))}.pt.trace.json.gz")
    old = os.path.join(run_dir, PLUGIN_DIR, name)
    return old if not os.path.lexists(path) and os.path.lexists(old) else path


def encode_trace(doc: Mapping[str, Any]) -> bytes:
    """``doc`` as gzip'd JSON (NaN and infinity refused: trace viewers reject them). Its ``distributedInfo``
    comes first, spelled ``"rank": <r>`` with the space: HTA takes a file's rank from the first text that
    matches ``"rank":\\s+(\\d+)``, and the rest is written without spaces."""
    info = doc.get("distributedInfo")
    rest = {k: v for k, v in doc.items() if k != "distributedInfo"}
    text = json.dumps(rest, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if isinstance(info, Mapping):
        head = json.dumps({"distributedInfo": info}, allow_nan=False).encode("utf-8")[:-1]
        text = head + (b"," + text[1:] if len(text) > 2 else b"}")
    return gzip.compress(text, compresslevel=6, mtime=0)


def write_trace(run_dir: str, name: str, doc: Mapping[str, Any] | bytes) -> str:
    """Write a trace (a document, or its :func:`encode_trace` bytes) below the run; return its path.

    Raises:
        OSError: the disk refused it (a partial file is removed), or a symlink is planted on the way.
    """
    data = doc if isinstance(doc, bytes) else encode_trace(doc)
    m = TRACE_FILE.match(name)
    path = (os.path.join(window_dir(run_dir, int(m.group("step"))), f"rank{int(m.group('rank'))}.pt.trace.json.gz")
            if m else trace_path(run_dir, name))
    fd = open_below(run_dir, path, _WRITE, 0o666, make_dirs=True)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        try:
            os.unlink(path)
            if m:  # the folders made for it, if nothing else is in them
                os.rmdir(os.path.dirname(path))
                os.rmdir(os.path.dirname(os.path.dirname(path)))
        except OSError:
            pass
        raise
    os.close(fd)
    return path


def list_traces(run_dir: str) -> list[dict[str, Any]]:
    """The run's traces (regular files only; a symlink is skipped), by step then rank:
    ``{"name", "rank", "step", "bytes"}`` (``name``: the :data:`TRACE_FILE` name of the window)."""
    folder = os.path.join(run_dir, PLUGIN_DIR)
    found: dict[str, dict[str, Any]] = {}
    for entry in _entries(folder):  # version 1: directly in the plugin folder
        m = TRACE_FILE.match(entry.name)
        size = _size(entry) if m else None
        if m and size is not None:
            found[entry.name] = {"name": entry.name, "rank": int(m.group("rank")), "step": int(m.group("step")),
                                 "bytes": size}
    for window in _entries(os.path.join(folder, TRACES_DIR)):
        w = _WINDOW_DIR.match(window.name)
        if w is None or not window.is_dir(follow_symlinks=False):
            continue
        for entry in _entries(window.path):
            m = _RANK_FILE.match(entry.name)
            size = _size(entry) if m else None
            if m and size is not None:
                rank, step = int(m.group("rank")), int(w.group("step"))
                name = trace_name(rank=rank, step=step)
                found[name] = {"name": name, "rank": rank, "step": step, "bytes": size}
    return sorted(found.values(), key=lambda t: (t["step"], t["rank"]))


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


def _size(entry: os.DirEntry[str]) -> int | None:
    """The size of a regular file (None: a symlink, not a file, gone)."""
    try:
        return entry.stat(follow_symlinks=False).st_size if entry.is_file(follow_symlinks=False) else None
    except OSError:
        return None


def read_trace(run_dir: str, name: str, *, root: str | None = None) -> dict[str, Any]:
    """The trace document ``name`` of a run.

    Args:
        run_dir: The run's directory.
        name: A file name :data:`TRACE_FILE` matches.
        root: The folder no symlink below which is followed (a server's logdir); None: the run.

    Raises:
        OSError: missing, a symlink, not a regular file, or larger than the limits.
        ValueError: not a trace document (bad gzip or JSON, no ``traceEvents`` list).
    """
    if not TRACE_FILE.match(name):
        raise ValueError(f"not a trace file name: {name!r}")
    fd, _ = open_regular_below(root or run_dir, trace_path(run_dir, name))
    return read_trace_fd(fd, name)


def read_trace_fd(fd: int, name: str) -> dict[str, Any]:
    """The trace document open at ``fd`` (closed here; ``name``: its file name, for messages). Raises as
    :func:`read_trace`; a document nested too deep to parse is a ValueError."""
    st = os.fstat(fd)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > MAX_BYTES:
            raise OSError(f"trace {name} is larger than {MAX_BYTES >> 20} MB")
        data = fh.read(MAX_BYTES + 1)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            chunks, got = [], 0  # in pieces: one read of the limit would take the limit's memory at once
            while got <= MAX_JSON_BYTES:
                chunk = gz.read(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            text = b"".join(chunks)
            del chunks
    except (OSError, EOFError) as exc:
        raise ValueError(f"trace {name} is not gzip: {exc}") from None
    if len(text) > MAX_JSON_BYTES:
        raise OSError(f"trace {name} inflates to more than {MAX_JSON_BYTES >> 20} MB")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError(f"trace {name} nests too deep to read") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"trace {name} has no traceEvents list")
    return doc
