"""Snapshot files on disk: naming, atomic writes, pruning to ``max_snapshots`` and a disk budget.

Files live in ``<logdir>/plugins/tbmem/`` and are named
``<kind>_rank<r>_step<000000123>.<ext>`` (``json.gz``, ``html``, ``pickle``).
Every file is written to a temporary name in the same folder and renamed
over the final name (``os.replace``), so a reader never sees half a file.
Out-of-memory snapshots (kind ``oom``) are never pruned.

Example:
    >>> import tempfile
    >>> from tbmem.snapshot.store import SnapshotStore
    >>> store = SnapshotStore(tempfile.mkdtemp(), rank=0, max_snapshots=2, max_disk_mb=0)
    >>> path = store.write_bytes(store.path("snapshot", 7, "json.gz"), b"{}")
    >>> path.endswith("plugins/tbmem/snapshot_rank0_step000000007.json.gz")
    True
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Callable

__all__ = ["SnapshotStore", "PLUGIN_DIR", "FILE_RE"]

PLUGIN_DIR = os.path.join("plugins", "tbmem")
FILE_RE = re.compile(r"^(?P<kind>[a-z]+)_rank(?P<rank>\d+)_step(?P<step>\d{9,})\.(?P<ext>json\.gz|html|pickle)$")


class SnapshotStore:
    """Writes and prunes the snapshot files of one rank.

    Args:
        log_dir: The run's logdir; files go to ``<log_dir>/plugins/tbmem``.
        rank: Rank in the file names (pruning only touches this rank's files).
        max_snapshots: Regular snapshots kept (0 = unlimited).
        max_disk_mb: Bytes budget of this rank's regular + OOM files in MiB (0 = unlimited).
    """

    def __init__(self, log_dir: str, *, rank: int, max_snapshots: int, max_disk_mb: float) -> None:
        self.folder = os.path.join(log_dir, PLUGIN_DIR)
        self.rank = rank
        self.max_snapshots = max_snapshots
        self.max_bytes = int(max_disk_mb * 2**20)

    def path(self, kind: str, step: int, ext: str) -> str:
        """The final path of one artifact."""
        return os.path.join(self.folder, f"{kind}_rank{self.rank}_step{step:09d}.{ext}")

    def write_bytes(self, path: str, data: bytes) -> str:
        """Write ``data`` atomically; OSError (full disk, read-only) propagates, no temp left."""
        return self.write_with(path, lambda fh: fh.write(data))

    def write_with(self, path: str, fill: Callable) -> str:
        """Atomically write the file that ``fill(binary_file)`` produces."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def groups(self) -> dict[tuple[str, int], list[str]]:
        """This rank's files grouped by (kind, step)."""
        out: dict[tuple[str, int], list[str]] = {}
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return out
        for name in names:
            m = FILE_RE.match(name)
            if m and int(m["rank"]) == self.rank:
                out.setdefault((m["kind"], int(m["step"])), []).append(os.path.join(self.folder, name))
        return out

    def prune(self, keep: tuple[str, int] | None = None) -> list[str]:
        """Remove the oldest regular snapshots beyond ``max_snapshots`` or the disk budget.

        ``keep`` (the snapshot just written) and every ``oom`` snapshot survive.
        Returns the removed paths.
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
            total -= sizes[key]
            count -= 1
        return removed


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
