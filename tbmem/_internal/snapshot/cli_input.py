"""FILE of ``tbmem snapshot html|stats``: opened once, checked, read; why not, in one line.

A path that is no snapshot file (a directory, a FIFO, a device, a symlink loop, a link to
nothing) gets a message that says what it is (a FIFO is never read, so the command cannot
hang on it); for a directory, the snapshot files in it are listed. The file that was
checked is the file that is read (one descriptor). Names from the file are made
printable before a summary reaches the terminal (:func:`for_terminal`).

Example:
    >>> import tempfile
    >>> from tbmem._internal.snapshot.cli_input import open_input
    >>> print(open_input(tempfile.mkdtemp()).split(";")[0].endswith("is a directory with no snapshot files"))
    True
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from typing import Any, BinaryIO

from tbmem._internal._terminal import printable

__all__ = ["open_input", "snapshots_in", "for_terminal", "SNAPSHOT_ENDINGS"]

#: Endings of the files ``tbmem snapshot`` reads.
SNAPSHOT_ENDINGS = (".json.gz", ".json", ".pickle", ".pkl", ".pt")
_SHOWN = 20
_MAX_DEPTH = 4
_MAX_ENTRIES = 20_000


def open_input(path: str) -> BinaryIO | str:
    """The file at ``path`` open for binary reading, or the line that says why it is not read."""
    name = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return _cannot_open(path, name, exc)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            return _not_a_file(path, name, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except OSError as exc:
        os.close(fd)
        return f"cannot read {name}: {exc.strerror or exc}"


def _cannot_open(path: str, name: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"cannot read {name}: it is a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT:
        if os.path.islink(path):
            return f"cannot read {name}: it is a symlink to {printable(os.readlink(path))}, which does not exist"
        return f"cannot read {name}: no such file"
    if exc.errno == errno.ENXIO:  # a socket (or a device with nothing behind it)
        return f"cannot read {name}: it is a socket or a device, not a snapshot file"
    return f"cannot read {name}: {exc.strerror or exc}"


def _not_a_file(path: str, name: str, mode: int) -> str:
    if stat.S_ISDIR(mode):
        found, more = snapshots_in(path)
        if not found:
            return (f"{name} is a directory with no snapshot files; give one of its snapshot files "
                    f"({', '.join(SNAPSHOT_ENDINGS)})")
        listed = "\n".join(f"  {printable(p)}" for p in found)
        extra = f"\n  ... and {more} more" if more else ""
        return f"{name} is a directory; give one of the snapshot files in it:\n{listed}{extra}"
    what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"cannot read {name}: it is {what}, not a snapshot file"


def snapshots_in(folder: str) -> tuple[list[str], int]:
    """Snapshot files below ``folder`` (symlinked folders not followed, a few levels deep), sorted:
    the first 20 and how many more there are."""
    found: list[str] = []
    seen = 0
    for here, dirs, files in os.walk(folder, followlinks=False):
        depth = os.path.relpath(here, folder).count(os.sep) + (here != folder)
        seen += len(dirs) + len(files)
        dirs[:] = sorted(d for d in dirs if depth < _MAX_DEPTH) if seen < _MAX_ENTRIES else []
        found += [os.path.join(here, f) for f in files if f.lower().endswith(SNAPSHOT_ENDINGS)
                  and os.path.isfile(os.path.join(here, f))]
    found.sort()
    return found[:_SHOWN], max(0, len(found) - _SHOWN)


def for_terminal(snap: Any) -> Any:
    """A copy of a :class:`~tbmem.Snapshot` whose names print safely (escape
    sequences and newlines written as ``\\x1b``, ``\\n``): frames, categories, devices, markers."""
    devices = [dataclasses.replace(d, name=printable(d.name), markers=[
        dict(m, label=printable(str(m.get("label", "")))) for m in d.markers]) for d in snap.devices]
    meta = dict(snap.meta)
    if isinstance(meta.get("exception"), str):
        meta["exception"] = printable(meta["exception"])
    return dataclasses.replace(snap, strings=[printable(s) for s in snap.strings], devices=devices, meta=meta,
                               categories=[printable(c) for c in snap.categories], source=printable(snap.source),
                               kind=printable(snap.kind))
