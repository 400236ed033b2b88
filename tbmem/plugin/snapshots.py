"""The snapshots of a run: tbmem's files and PyTorch pickles found under it, behind opaque ids.

A run's snapshots are tbmem's ``plugins/tbmem/<kind>_rank<r>_step<n>.json.gz`` (a CUDA
snapshot's ``.pickle`` twin is the same snapshot and is not listed twice) and every
``*.pickle`` / ``*.pkl`` below the run directory, such as Composer's or torchtitan's
``memory_snapshot/iteration_20/rank0_memory_snapshot.pickle``. Subdirectories that hold
event files are runs of their own and are not searched. Each file gets an id derived
from its path relative to the run; the client sends that id back, never a path, and the
file is found again by listing. Files whose realpath leaves the logdir (symlinks) are
neither listed nor served. A file is served from the realpath found when it was listed,
opened once with ``O_NOFOLLOW`` on every component below the logdir and checked with
``fstat`` (:func:`tbmem.plugin.paths.open_regular_below`): a symlink swapped in after the
listing is refused, never followed. Pages are rendered in a child process with a memory
limit (:mod:`tbmem.plugin.convert`); requests for one file while it converts share that
conversion, and the last pages are kept. Pickles are read as plain data
(:mod:`tbmem.snapshot.pickle_stream`): a file naming any Python object is refused, so
nothing in a file ever runs.

Example:
    >>> import os, tempfile
    >>> from tbmem.plugin.snapshots import find_snapshots
    >>> run = os.path.realpath(tempfile.mkdtemp())
    >>> os.makedirs(f"{run}/traces/iteration_20")
    >>> open(f"{run}/traces/iteration_20/rank0_memory_snapshot.pickle", "wb").close()
    >>> [(s.name, s.step, s.format) for s in find_snapshots(run, run)]
    [('traces/iteration_20/rank0_memory_snapshot.pickle', 20, 'pickle')]
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tbmem.plugin.convert import DEFAULT_BUDGET_MB, TIMEOUT_S, Budget, ConversionFailed, render_page
from tbmem.plugin.paths import inside, open_regular_below
from tbmem.snapshot.store import FILE_RE, PLUGIN_DIR

__all__ = ["SnapshotEntry", "find_snapshots", "SnapshotPages", "SnapshotError", "MAX_SNAPSHOT_BYTES"]

_PICKLE = (".pickle", ".pkl")
_STEP_IN_PATH = re.compile(r"(?:step|iteration|iter|it)[_\-]?(\d+)", re.IGNORECASE)
_MAX_DEPTH = 6
_MAX_ENTRIES = 50_000  # directory entries looked at per listing: a huge run folder stays cheap
#: Larger files are not rendered in the tab (``tbmem snapshot html`` writes their page offline).
MAX_SNAPSHOT_BYTES = 1 << 30


@dataclass(frozen=True)
class SnapshotEntry:
    """One snapshot file of a run. ``path`` stays on the server; :meth:`to_json` omits it.

    Example:
        >>> e = SnapshotEntry(id="0f", name="a.pickle", format="pickle", kind="snapshot", rank=None,
        ...                   step=None, size=1, mtime=0.0, path="/logs/run/a.pickle")
        >>> "path" in e.to_json()
        False
    """

    id: str
    name: str
    format: str
    kind: str
    rank: int | None
    step: int | None
    size: int
    mtime: float
    path: str  # the realpath when listed: what is opened (no symlink followed below the logdir)

    def to_json(self) -> dict[str, Any]:
        """What the client sees."""
        return {"id": self.id, "name": self.name, "format": self.format, "kind": self.kind,
                "rank": self.rank, "step": self.step, "size": self.size, "mtime": self.mtime}


def _entry(path: str, real: str, run_dir: str, fmt: str, kind: str, rank: int | None, step: int | None,
           st: os.stat_result) -> SnapshotEntry:
    rel = os.path.relpath(path, run_dir).replace(os.sep, "/")
    sid = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return SnapshotEntry(id=sid, name=rel, format=fmt, kind=kind, rank=rank, step=step, size=st.st_size,
                         mtime=st.st_mtime, path=real)


def _regular_inside(path: str, root: str) -> tuple[str, os.stat_result] | None:
    """(realpath, its lstat) when ``path`` resolves to a regular file inside ``root``; else None."""
    real = os.path.realpath(path)
    if not inside(real, root):
        return None
    try:
        st = os.lstat(real)
    except OSError:
        return None
    return (real, st) if stat.S_ISREG(st.st_mode) else None


def _has_events(names: list[str]) -> bool:
    return any("tfevents" in n for n in names)


def find_snapshots(run_dir: str, root: str) -> list[SnapshotEntry]:
    """Every snapshot of the run in ``run_dir`` (a realpath inside ``root``), sorted by step then name."""
    found: dict[str, SnapshotEntry] = {}
    tbmem_keys: dict[tuple[str, int, int], SnapshotEntry] = {}
    plugin_dir = os.path.join(run_dir, PLUGIN_DIR)
    seen = 0
    for here, dirs, files in os.walk(run_dir, followlinks=False):
        depth = os.path.relpath(here, run_dir).count(os.sep) + (here != run_dir)
        seen += len(dirs) + len(files)
        # subfolders with event files are other runs (exp/rank0 below exp): their snapshots are theirs
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < _MAX_DEPTH
                         and not _has_events(_listdir(os.path.join(here, d))))
        if seen > _MAX_ENTRIES:
            dirs[:] = []
        for name in sorted(files):
            path = os.path.join(here, name)
            m = FILE_RE.match(name) if here == plugin_dir else None
            m = m if m and m["ext"] in ("json.gz", "pickle") else None
            if m is None and not name.lower().endswith(_PICKLE):
                continue
            hit = _regular_inside(path, root)
            if hit is None:
                continue  # dangling, special, or a symlink out of the logdir
            if m:
                key = (m["kind"], int(m["rank"]), int(m["step"]))
                prev = tbmem_keys.get(key)
                if prev is None or (prev.format == "pickle" and m["ext"] == "json.gz"):
                    tbmem_keys[key] = _entry(path, hit[0], run_dir, "tbmem" if m["ext"] == "json.gz" else "pickle",
                                             m["kind"], int(m["rank"]), int(m["step"]), hit[1])
            else:
                rel = os.path.relpath(path, run_dir)
                steps = _STEP_IN_PATH.findall(rel)
                e = _entry(path, hit[0], run_dir, "pickle", "oom" if "oom" in name.lower() else "snapshot",
                           None, int(steps[-1]) if steps else None, hit[1])
                found[e.id] = e
    for e in tbmem_keys.values():
        found[e.id] = e
    return sorted(found.values(), key=lambda e: (e.step is None, e.step or 0, e.name))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class SnapshotError(Exception):
    """A snapshot cannot be shown; ``status`` is the HTTP status, the message is safe to show.

    Example:
        >>> SnapshotError(422, "not a snapshot").status
        422
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Flight:
    """One conversion in progress, waited on by the requests for the same file that came meanwhile."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.page: str | None = None
        self.error: tuple[int, str] | None = None

    def answer(self) -> str:
        return _answer(self.page if self.page is not None else self.error)  # type: ignore[arg-type]


class SnapshotPages:
    """Renders snapshot pages with the offline viewer: memory bounded, shared and kept.

    Each file is converted once however many requests ask for it at once (they wait for the
    one conversion), in a child process whose memory is limited (:mod:`tbmem.plugin.convert`);
    the conversions running at once share ``budget_mb``. The last ``size`` pages, at most
    ``cache_mb`` together, and the answers for files that cannot be shown are kept, keyed by
    the file's device, inode, size and modification time.

    Example:
        >>> import os, tempfile
        >>> from tbmem.snapshot.schema import SnapshotBuilder, encode_json_gz
        >>> run = os.path.realpath(tempfile.mkdtemp())
        >>> os.makedirs(f"{run}/plugins/tbmem")
        >>> b = SnapshotBuilder(source="dispatch", device="cpu")
        >>> _ = b.alloc(64, time_us=0)
        >>> with open(f"{run}/plugins/tbmem/snapshot_rank0_step000000003.json.gz", "wb") as fh:
        ...     _ = fh.write(encode_json_gz(b.build(kind="snapshot", step=3)))
        >>> (entry,) = find_snapshots(run, run)
        >>> SnapshotPages().page(entry, run).startswith("<!DOCTYPE html>")
        True
    """

    def __init__(self, size: int = 4, *, cache_mb: int = 256, budget_mb: int = DEFAULT_BUDGET_MB,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._size = size
        self._cache_bytes = cache_mb * 2**20
        self._budget = Budget(budget_mb * 2**20)
        self._timeout = timeout_s
        self._pages: OrderedDict[tuple[int, int, int, int], str | tuple[int, str]] = OrderedDict()
        self._flights: dict[tuple[int, int, int, int], _Flight] = {}
        self._lock = threading.Lock()

    def page(self, entry: SnapshotEntry, root: str) -> str:
        """The viewer page for ``entry``, a file listed below ``root``.

        Raises:
            SnapshotError: 404 no longer a regular file there (a symlink now, say), 413 too large
                or over the memory limit, 422 not a snapshot or a pickle naming Python objects,
                503 busy or too slow.
        """
        try:
            fd, st = open_regular_below(root, entry.path)
        except OSError:
            raise SnapshotError(404, f"{entry.name} is no longer a file of the run") from None
        try:
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                kept = self._pages.get(key)
                if kept is not None:
                    self._pages.move_to_end(key)
                    flight, mine = None, False
                else:
                    flight = self._flights.get(key)
                    mine = flight is None
                    if mine:
                        flight = self._flights[key] = _Flight()
            if kept is not None:
                return _answer(kept)
            assert flight is not None
            if not mine:
                flight.done.wait()
                return flight.answer()
            try:
                flight.page = self._convert(fd, st, entry)
            except SnapshotError as exc:
                flight.error = (exc.status, str(exc))
            finally:
                with self._lock:
                    self._keep(key, flight)
                    del self._flights[key]
                flight.done.set()
            return flight.answer()
        finally:
            os.close(fd)

    def _convert(self, fd: int, st: os.stat_result, entry: SnapshotEntry) -> str:
        if st.st_size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(413, f"{entry.name} is {st.st_size / 2**30:.1f} GiB; open it offline with "
                                     f"`tbmem snapshot html`")
        try:
            return render_page(fd, st.st_size, name=entry.name, step=entry.step if entry.format == "pickle" else None,
                               budget=self._budget, timeout=self._timeout)
        except ConversionFailed as exc:
            raise SnapshotError(exc.status, str(exc)) from None

    def _keep(self, key: tuple[int, int, int, int], flight: _Flight) -> None:
        if flight.page is None and (flight.error is None or flight.error[0] in (500, 503)):
            return  # busy, too slow or a crash: tried again next time
        self._pages[key] = flight.page if flight.page is not None else flight.error  # type: ignore[assignment]
        kept = sum(len(v) for v in self._pages.values() if isinstance(v, str))
        while len(self._pages) > self._size or (len(self._pages) > 1 and kept > self._cache_bytes):
            _, dropped = self._pages.popitem(last=False)
            kept -= len(dropped) if isinstance(dropped, str) else 0


def _answer(kept: str | tuple[int, str] | None) -> str:
    if isinstance(kept, tuple):
        raise SnapshotError(*kept)
    if kept is None:
        raise SnapshotError(500, "the snapshot could not be converted")
    return kept
