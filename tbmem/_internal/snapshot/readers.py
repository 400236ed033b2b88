"""Reading snapshot files: tbmem's gzip JSON and PyTorch's pickles, of any size, as plain data.

Pickles (``torch.cuda.memory._dump_snapshot``, Composer's, torchtitan's) are read by
:mod:`tbmem._internal.snapshot.pickle_stream`, which interprets only plain-data opcodes (a file naming
any Python object is refused before anything is imported) and turns trace events straight
into integer columns, so a 1 GB pickle needs a fraction of the memory of unpickling it. Where
tbmem's C extension was not built (a clone without ``setup.py build_ext``; wheels have it),
a pickle the user named (the CLI) is unpickled whole by the restricted Unpickler of :mod:`tbmem._internal.snapshot.safe_pickle`
(which refuses the same files) and converted from plain data: the same snapshot, about 10 times
slower and with about 3 times the memory.
Every reader is bounded (:class:`~tbmem._internal.snapshot.pickle_rows.Limits`): a file over a limit,
truncated or malformed raises :class:`~tbmem._internal.snapshot.pickle_rows.SnapshotRefused` (a
ValueError) saying why. Nothing here imports torch. Summaries: :mod:`tbmem._internal.snapshot.stats`.

Example:
    >>> import io, os, pickle, tempfile
    >>> from tbmem._internal.snapshot.readers import load_snapshot
    >>> ev = {"action": "alloc", "addr": 64, "size": 512, "stream": 0, "time_us": 1_700_000_000_000_000,
    ...       "frames": [{"filename": "/home/u/train.py", "line": 3, "name": "step"}]}
    >>> path = os.path.join(tempfile.mkdtemp(), "s.pickle")
    >>> with open(path, "wb") as fh:
    ...     pickle.dump({"segments": [], "device_traces": [[], [ev]]}, fh)
    >>> snap = load_snapshot(path)
    >>> snap.device, snap.peak_bytes(), snap.t0_unix
    ('cuda:1', 512, 1700000000.0)
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import zlib
from typing import Any, BinaryIO, Callable

from tbmem._internal.snapshot.cuda import convert_rows, convert_torch_snapshot
from tbmem._internal.snapshot.pickle_crun import C_READER
from tbmem._internal.snapshot.pickle_rows import Limits, SnapshotRefused
from tbmem._internal.snapshot.pickle_stream import read_pickle
from tbmem._internal.snapshot.safe_pickle import UnsafePickleError, load_plain, looks_like_pickle
from tbmem._internal.snapshot.schema import NotASnapshot, Snapshot, read_json_gz
from tbmem._internal.snapshot.stats import format_bytes, stats_doc, stats_text

__all__ = ["load_snapshot", "read_snapshot", "load_torch_pickle", "is_pickle_path", "format_bytes", "snapshot_stats",
           "stats_json", "SnapshotRefused", "Limits"]

_PICKLE_EXTS = (".pickle", ".pkl", ".pt")
_FORMATS = ("tbmem reads its own snapshots (.json.gz, or .json) and PyTorch memory snapshot pickles "
            "(torch.cuda.memory._dump_snapshot, .pickle)")


def is_pickle_path(path: str | os.PathLike[str]) -> bool:
    """Whether a path names a pickle (by extension)."""
    return os.fspath(path).lower().endswith(_PICKLE_EXTS)


def load_torch_pickle(path: str | os.PathLike[str] | BinaryIO) -> Any:
    """The whole snapshot pickle as plain Python data (dicts and lists); nothing in it can run.

    This materialises every event (about 550 bytes each): for ``--torch`` and small files.
    :func:`load_snapshot` streams instead.

    Raises:
        tbmem._internal.snapshot.safe_pickle.UnsafePickleError: the file names a Python object.
        ValueError: the file is plain data but not a snapshot.
    """
    source = path if hasattr(path, "read") else os.fspath(path)
    data = load_plain(source)
    if not (isinstance(data, dict) and "segments" in data) and not isinstance(data, list):
        raise ValueError(f"{getattr(path, 'name', path)} is not a torch.cuda.memory._snapshot() pickle")
    return data


def load_snapshot(path: str | os.PathLike[str], *, allow_pickle: bool = True, limits: Limits | None = None,
                  progress: Callable[[int], None] | None = None) -> Snapshot:
    """Load a tbmem ``.json.gz`` snapshot or a PyTorch pickle (read as plain data, never run).

    Args:
        path: The file.
        allow_pickle: False refuses pickles (for callers that want tbmem's own files only).
        limits: Bounds on what the file may make the reader hold (defaults: :class:`Limits`).
        progress: Called with the bytes read so far while a pickle is read.

    Raises:
        ValueError: not a valid snapshot (:class:`SnapshotRefused` says why: malformed,
            truncated, over a limit), or a pickle and ``allow_pickle`` is False.
        tbmem._internal.snapshot.safe_pickle.UnsafePickleError: a pickle names a Python object.
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as fh:
        return read_snapshot(fh, path, allow_pickle=allow_pickle, limits=limits, progress=progress)


def read_snapshot(fh: BinaryIO, name: str, *, allow_pickle: bool = True, limits: Limits | None = None,
                  progress: Callable[[int], None] | None = None, unpickle: bool = True) -> Snapshot:
    """:func:`load_snapshot` of a file already open (binary, seekable, at its start): the one reader
    of the CLI and the Memory tab, which opens a file once and reads what it checked.

    ``name`` names the file in messages (and says by its ending whether it is gzip or a pickle).
    ``unpickle=False`` (the Memory tab: files of a logdir nobody named) never hands a pickle to an
    Unpickler, restricted or not: without the C runs its every event is read by the plain-data
    interpreter (slower) instead.
    Whatever the file holds, a document of the wrong shape included, ends as one of the errors
    :func:`load_snapshot` lists, never as a TypeError from inside a summary.
    """
    limits = limits or Limits()
    head = fh.read(2)
    fh.seek(0)
    try:
        if is_pickle_path(name) or looks_like_pickle(head):
            if not allow_pickle:
                raise ValueError(f"not reading {name}: pickles were not allowed by the caller")
            if not C_READER and unpickle:  # a file the user named: the restricted Unpickler is faster
                return _unpickled(fh, name, limits, progress)
            top, rows = read_pickle(fh, limits=limits, progress=progress, c_reader=C_READER)
            return convert_rows(top, rows, kind="snapshot", step=0, limits=limits)
        return read_json_gz(name, max_bytes=limits.max_decompressed_bytes, max_ratio=limits.max_gzip_ratio,
                            fileobj=fh)
    except (EOFError, UnicodeDecodeError, gzip.BadGzipFile, zlib.error) as exc:
        raise SnapshotRefused(f"{name} is truncated or not gzip JSON ({exc}); {_FORMATS}") from None
    except (json.JSONDecodeError, NotASnapshot):
        raise SnapshotRefused(f"{name} is not a snapshot: {_FORMATS}") from None
    except RecursionError:
        raise SnapshotRefused(f"{name} is nested too deeply to be a snapshot") from None
    except ValueError as exc:
        if isinstance(exc, SnapshotRefused):
            raise
        raise SnapshotRefused(str(exc) if str(exc).startswith(f"{name} ") else
                              f"{name} is not a valid snapshot: {exc}") from None
    except (TypeError, KeyError, IndexError, AttributeError) as exc:  # a shape no check foresaw
        raise SnapshotRefused(f"{name} is not a valid snapshot ({type(exc).__name__}: {exc})") from None


class _Counted:
    """A binary file that reports the bytes read so far (what the Unpickler calls on it)."""

    def __init__(self, fh: BinaryIO, progress: Callable[[int], None]) -> None:
        self._fh, self._progress, self._done = fh, progress, 0

    def _count(self, data: bytes) -> bytes:
        self._done += len(data)
        self._progress(self._done)
        return data

    def read(self, n: int = -1) -> bytes:
        return self._count(self._fh.read(n))

    def readline(self) -> bytes:
        return self._count(self._fh.readline())

    def readinto(self, buf: Any) -> int:
        n = self._fh.readinto(buf)  # type: ignore[attr-defined]
        self._done += n or 0
        self._progress(self._done)
        return n


def _unpickled(fh: BinaryIO, name: str, limits: Limits, progress: Callable[[int], None] | None) -> Snapshot:
    """The fallback without the C extension: the whole pickle unpickled as plain data, then converted."""
    try:
        data = load_plain(_Counted(fh, progress) if progress else fh)  # type: ignore[arg-type]  # read, readline, readinto
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, OverflowError) as exc:  # a MemoryError stays one (the tab answers 413)
        raise SnapshotRefused(f"{name} is not a valid snapshot pickle ({type(exc).__name__}: {exc})") from None
    if not (isinstance(data, dict) and "segments" in data) and not isinstance(data, list):
        raise SnapshotRefused(f"{name} holds plain data but not a snapshot: {_FORMATS}")
    return convert_torch_snapshot(data, kind="snapshot", step=0, limits=limits)


def snapshot_stats(snap: Snapshot, *, top: int = 10, device: str | None = None, cpp: bool = False) -> str:
    """Per device: reserved, allocated, peak, OOMs, top allocations, frames and categories (text)."""
    return stats_text(snap, top=top, device=device, cpp=cpp)


def stats_json(snap: Snapshot, *, top: int = 10, device: str | None = None) -> dict[str, Any]:
    """The ``tbmem snapshot stats --json`` document (schema in docs/snapshots.md)."""
    return stats_doc(snap, top=top, device=device)
