"""Snapshot files on disk: naming, atomic writes, pruning to ``max_snapshots`` and a disk budget.

Files live in ``<logdir>/plugins/tbmem/`` and are named
``<kind>_rank<r>_step<000000123>.<ext>`` (``json.gz``, ``html``, ``pickle``).
Every file is written to a temporary name in the same folder and then linked to
its final name, so a reader never sees half a file and a name that exists is
never overwritten: when another writer (a second run on the same logdir, a copy
of the user's) already holds a snapshot's name, this one is written as
``<kind>_rank<r>_step<000000123>-2.<ext>`` (then ``-3``, ...).

Files get the permissions the process's umask gives new files (as TensorBoard's event
files do), not ``tempfile``'s private 0600.

Pruning removes only files this store wrote (tracked as they are written, never
found by pattern), oldest first; out-of-memory snapshots (kind ``oom``) are
never pruned.

A temporary file is named after the process writing it (``.tmp-<pid>-<host>-*.part``).
A write that a signal ends is not unwound: on SIGTERM tbmem's handler removes the
files being written (:func:`remove_partial_files`) before the process dies, and the
temporary files of a process that was killed outright (SIGKILL, the OOM killer) are
removed by the next store opened on the folder, on the same host, once that process is
gone.

Example:
    >>> import tempfile
    >>> from tbmem._internal.snapshot.store import SnapshotStore
    >>> store = SnapshotStore(tempfile.mkdtemp(), rank=0, max_snapshots=2, max_disk_mb=0)
    >>> path = store.write_bytes(store.path("snapshot", 7, "json.gz"), b"{}")
    >>> path.endswith("plugins/tbmem/snapshot_rank0_step000000007.json.gz")
    True
    >>> paths, error = store.write_files("snapshot", 7, [("json.gz", lambda fh: fh.write(b"{}"))])
    >>> paths[0].endswith("snapshot_rank0_step000000007-2.json.gz"), error
    (True, None)
"""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile
import threading
from typing import Callable, Sequence

# the names are the logdir layout's (PLUGIN_DIR and FILE_RE here too, for the store's readers)
from tbmem._internal.logdir.layout import PLUGIN_DIR, SNAPSHOT_EXTS, TEMP_FILE, snapshot_name, temp_prefix
from tbmem._internal.logdir.layout import SNAPSHOT_FILE as FILE_RE

__all__ = ["SnapshotStore", "PLUGIN_DIR", "FILE_RE", "remove_partial_files"]

_MAX_DUPS = 1000
_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:40] or "host"
# temporary files being written by this process, for remove_partial_files
_writing: set[str] = set()
_writing_lock = threading.Lock()


def remove_partial_files() -> None:
    """Remove the temporary files this process is writing (SIGTERM: the writes will not finish)."""
    with _writing_lock:
        paths = list(_writing)
        _writing.clear()
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (on this host) no longer runs; a zombie is gone too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _remove_stale_temps(folder: str) -> None:
    """Remove temporary files left in ``folder`` by processes of this host that were killed mid-write."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = TEMP_FILE.match(name)
        if m is None or m["host"] != _HOST or int(m["pid"]) == os.getpid() or not _gone(int(m["pid"])):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``);
    elsewhere set and restored at once (another thread creating a file in between would get 022)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class SnapshotStore:
    """Writes and prunes the snapshot files of one rank.

    Args:
        log_dir: The run's logdir; files go to ``<log_dir>/plugins/tbmem``.
        rank: Rank in the file names.
        max_snapshots: Regular snapshots kept (0 = unlimited).
        max_disk_mb: Bytes budget of the regular + OOM files this store wrote, in MiB (0 = unlimited).
    """

    def __init__(self, log_dir: str, *, rank: int, max_snapshots: int, max_disk_mb: float) -> None:
        self.folder = os.path.join(log_dir, PLUGIN_DIR)
        self.rank = rank
        self.max_snapshots = max_snapshots
        self.max_bytes = int(max_disk_mb * 2**20)
        self._mine: dict[tuple[str, int], list[str]] = {}  # (kind, step) -> paths this store wrote
        _remove_stale_temps(self.folder)

    def path(self, kind: str, step: int, ext: str, dup: int = 1) -> str:
        """The final path of one artifact (``dup`` > 1: the name taken when another writer holds it)."""
        return os.path.join(self.folder, snapshot_name(kind, rank=self.rank, step=step, ext=ext, dup=dup))

    def write_bytes(self, path: str, data: bytes) -> str:
        """Write ``data`` atomically; OSError (full disk, read-only, name taken) propagates, no temp left."""
        return self.write_with(path, lambda fh: fh.write(data))

    def write_with(self, path: str, fill: Callable, *, exclusive: bool = False) -> str:
        """Atomically write the file that ``fill(binary_file)`` produces.

        ``exclusive``: raise FileExistsError instead of replacing a file already at ``path``.
        """
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=temp_prefix(os.getpid(), _HOST), suffix=".part")
        with _writing_lock:
            _writing.add(tmp)
        try:
            # mkstemp makes the file 0600; a snapshot is shared like the event files beside it
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as fh:
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            if exclusive:
                _link_exclusive(tmp, path)
            else:
                os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            with _writing_lock:
                _writing.discard(tmp)
        self._track(path)
        return path

    def write_files(self, kind: str, step: int, files: Sequence[tuple[str, Callable]]
                    ) -> tuple[list[str], OSError | None]:
        """Write one snapshot's files under a name no other file holds; stop at the first I/O error.

        Args:
            files: ``(ext, fill)`` pairs, the first one (the ``.json.gz``) decides the name.

        Returns:
            The paths written (the first files when a later one failed) and the error, if any.
        """
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as exc:
            return [], exc
        dup = 1
        while dup <= _MAX_DUPS:
            taken = any(os.path.lexists(self.path(kind, step, ext, dup)) for ext in SNAPSHOT_EXTS)
            if taken:
                dup += 1
                continue
            written: list[str] = []
            try:
                for ext, fill in files:
                    written.append(self.write_with(self.path(kind, step, ext, dup), fill, exclusive=True))
            except _NameTaken as exc:
                if not written:  # another writer took this name between the check and the link
                    dup += 1
                    continue
                return written, exc
            except OSError as exc:
                return written, exc
            return written, None
        return [], OSError(errno.EEXIST, f"{_MAX_DUPS} snapshots named {kind} step {step} exist already")

    def _track(self, path: str) -> None:
        m = FILE_RE.match(os.path.basename(path))
        if m and int(m["rank"]) == self.rank:
            group = self._mine.setdefault((m["kind"], int(m["step"])), [])
            if path not in group:
                group.append(path)

    def groups(self) -> dict[tuple[str, int], list[str]]:
        """This store's files still on disk, grouped by (kind, step)."""
        return {k: [p for p in v if os.path.lexists(p)] for k, v in self._mine.items()
                if any(os.path.lexists(p) for p in v)}

    def prune(self, keep: tuple[str, int] | None = None) -> list[str]:
        """Remove the oldest regular snapshots this store wrote beyond ``max_snapshots`` or the disk budget.

        ``keep`` (the snapshot just written) and every ``oom`` snapshot survive; files this
        store did not write are never touched. Returns the removed paths.
        """
        groups = self.groups()
        regular = sorted(k for k in groups if k[0] != "oom" and k != keep)
        sizes = {k: sum(_size(p) for p in v) for k, v in groups.items()}
        total = sum(sizes.values())
        count = len(regular) + (1 if keep is not None and keep[0] != "oom" else 0)
        removed: list[str] = []
        for key in regular:  # oldest step first
            over_count = self.max_snapshots > 0 and count > self.max_snapshots
            over_disk = self.max_bytes > 0 and total > self.max_bytes
            if not (over_count or over_disk):
                break
            for p in groups[key]:
                try:
                    os.unlink(p)
                    removed.append(p)
                except FileNotFoundError:
                    pass
            self._mine.pop(key, None)
            total -= sizes[key]
            count -= 1
        return removed


class _NameTaken(FileExistsError):
    """The final name of a file exists (another writer's, or the user's)."""


def _link_exclusive(tmp: str, path: str) -> None:
    """Give ``tmp`` the name ``path`` unless that name exists (then :class:`_NameTaken`)."""
    try:
        os.link(tmp, path)
    except FileExistsError as exc:
        raise _NameTaken(exc.errno, f"{path} exists already") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK,
                             errno.ENOSYS):
            raise
        # No hard links on this filesystem: claim the name, then replace the placeholder.
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError as taken:
            raise _NameTaken(taken.errno, f"{path} exists already") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
