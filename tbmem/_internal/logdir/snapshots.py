"""The snapshots of a run: tbmem's files and PyTorch pickles found under it, each with an opaque id.

A run's snapshots are tbmem's ``plugins/tbmem/<kind>_rank<r>_step<n>.json.gz``
(:data:`tbmem._internal.logdir.layout.SNAPSHOT_FILE`; a CUDA snapshot's ``.pickle`` twin is the same
snapshot and is not listed twice) and every ``*.pickle`` / ``*.pkl`` below the run
directory, such as Composer's or torchtitan's
``memory_snapshot/iteration_20/rank0_memory_snapshot.pickle``. Subdirectories that hold
event files are runs of their own and are not searched. Each file gets an id derived from
its path relative to the run: the Memory tab's client sends that id back, never a path, and
the file is found again by listing. Files whose realpath leaves the logdir (symlinks) are
not listed; an entry keeps the realpath found when listed, which a reader opens with
:func:`tbmem._internal.logdir.safe_open.open_regular_below`. The Memory tab, ``tbmem snapshot`` and the
notebook list snapshots here; nothing here reads a file's contents.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.snapshots import find_snapshots
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
from dataclasses import dataclass
from typing import Any

from tbmem._internal.logdir.layout import EVENT_FILE_MARK, SNAPSHOT_FILE, plugin_dir
from tbmem._internal.logdir.safe_open import inside

__all__ = ["SnapshotEntry", "find_snapshots"]

_PICKLE = (".pickle", ".pkl")
_STEP_IN_PATH = re.compile(r"(?:step|iteration|iter|it)[_\-]?(\d+)", re.IGNORECASE)
_MAX_DEPTH = 6
_MAX_ENTRIES = 50_000  # directory entries looked at per listing: a huge run folder stays cheap


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
    try:
        # a link swapped for a file while it is resolved makes readlink fail (EINVAL): not a hit now
        real = os.path.realpath(path)
        if not inside(real, root):
            return None
        st = os.lstat(real)
    except OSError:
        return None
    return (real, st) if stat.S_ISREG(st.st_mode) else None


def _has_events(names: list[str]) -> bool:
    return any(EVENT_FILE_MARK in n for n in names)


def find_snapshots(run_dir: str, root: str) -> list[SnapshotEntry]:
    """Every snapshot of the run in ``run_dir`` (a realpath inside ``root``), sorted by step then name."""
    found: dict[str, SnapshotEntry] = {}
    tbmem_keys: dict[tuple[str, int, int], SnapshotEntry] = {}
    plugin = plugin_dir(run_dir)
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
            m = SNAPSHOT_FILE.match(name) if here == plugin else None
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
