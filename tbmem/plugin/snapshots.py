"""The snapshots of a run: tbmem's files and PyTorch pickles found under it, behind opaque ids.

A run's snapshots are tbmem's ``plugins/tbmem/<kind>_rank<r>_step<n>.json.gz`` (a CUDA
snapshot's ``.pickle`` twin is the same snapshot and is not listed twice) and every
``*.pickle`` / ``*.pkl`` below the run directory, such as Composer's or torchtitan's
``memory_snapshot/iteration_20/rank0_memory_snapshot.pickle``. Subdirectories that hold
event files are runs of their own and are not searched. Each file gets an id derived
from its path relative to the run; the client sends that id back, never a path, and the
file is found again by listing. Files whose realpath leaves the logdir (symlinks) are
neither listed nor served. Pickles are read by :mod:`tbmem.snapshot.safe_pickle`, which
refuses every Python object a file names, so nothing in a file ever runs.

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
import pickle
import re
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tbmem.plugin.paths import inside
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
    path: str

    def to_json(self) -> dict[str, Any]:
        """What the client sees."""
        return {"id": self.id, "name": self.name, "format": self.format, "kind": self.kind,
                "rank": self.rank, "step": self.step, "size": self.size, "mtime": self.mtime}


def _entry(path: str, run_dir: str, fmt: str, kind: str, rank: int | None, step: int | None) -> SnapshotEntry:
    rel = os.path.relpath(path, run_dir).replace(os.sep, "/")
    st = os.stat(path)
    sid = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return SnapshotEntry(id=sid, name=rel, format=fmt, kind=kind, rank=rank, step=step, size=st.st_size,
                         mtime=st.st_mtime, path=path)


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
            if not os.path.isfile(path) or not inside(path, root):
                continue  # dangling, special, or a symlink out of the logdir
            m = FILE_RE.match(name) if here == plugin_dir else None
            if m and m["ext"] in ("json.gz", "pickle"):
                key = (m["kind"], int(m["rank"]), int(m["step"]))
                prev = tbmem_keys.get(key)
                if prev is None or (prev.format == "pickle" and m["ext"] == "json.gz"):
                    tbmem_keys[key] = _entry(path, run_dir, "tbmem" if m["ext"] == "json.gz" else "pickle",
                                             m["kind"], int(m["rank"]), int(m["step"]))
            elif name.lower().endswith(_PICKLE):
                rel = os.path.relpath(path, run_dir)
                steps = _STEP_IN_PATH.findall(rel)
                e = _entry(path, run_dir, "pickle", "oom" if "oom" in name.lower() else "snapshot",
                           None, int(steps[-1]) if steps else None)
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


class SnapshotPages:
    """Renders snapshot pages with the offline viewer, keeping the last few in memory.

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
        >>> SnapshotPages().page(entry).startswith("<!DOCTYPE html>")
        True
    """

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._pages: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        self._lock = threading.Lock()

    def page(self, entry: SnapshotEntry) -> str:
        """The viewer page for ``entry``.

        Raises:
            SnapshotError: 413 too large, 422 not a snapshot or a pickle naming Python objects.
        """
        st = os.stat(entry.path)
        key = (entry.path, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._pages:
                self._pages.move_to_end(key)
                return self._pages[key]
        if st.st_size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(413, f"{entry.name} is {st.st_size / 2**30:.1f} GiB; open it offline with "
                                     f"`tbmem snapshot html`")
        html = _render(entry)
        with self._lock:
            self._pages[key] = html
            while len(self._pages) > self._size:
                self._pages.popitem(last=False)
        return html


def _render(entry: SnapshotEntry) -> str:
    from tbmem.snapshot.readers import load_snapshot
    from tbmem.snapshot.safe_pickle import UnsafePickleError
    from tbmem.snapshot.viewer import render_html

    try:
        snap = load_snapshot(entry.path)
    except UnsafePickleError:
        raise SnapshotError(422, f"{entry.name} is not plain data (it names Python objects); "
                                 f"tbmem never runs code from a file, so it is not shown") from None
    except (ValueError, KeyError, TypeError, IndexError, EOFError, OSError, zlib.error,
            pickle.UnpicklingError) as exc:
        raise SnapshotError(422, f"{entry.name} is not a readable memory snapshot "
                                 f"({type(exc).__name__})") from None
    if entry.format == "pickle" and entry.step is not None and not snap.step:
        snap.step = entry.step  # the loader cannot know it; the path (iteration_20) did
    return render_html(snap)
