"""Reading snapshot files and summarising them (``tbmem snapshot stats``).

tbmem reads its own gzip JSON format and PyTorch's pickles
(``torch.cuda.memory._dump_snapshot``, Composer's and torchtitan's). Pickles are
read by :mod:`tbmem.snapshot.safe_pickle`, which refuses every Python object a
file names, so no code from a pickle ever runs. Nothing here imports torch.

Example:
    >>> from tbmem.snapshot.schema import SnapshotBuilder
    >>> from tbmem.snapshot.readers import snapshot_stats
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> _ = b.alloc(2048, category="activation", stack=[("train.py", 9, "forward")], time_us=0)
    >>> print(snapshot_stats(b.build(kind="snapshot", step=1)).splitlines()[0])
    snapshot step 1 rank 0: dispatch on cpu, 1 events, 1 allocations, peak 2.0 KiB at event 0
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tbmem.snapshot.cuda import convert_torch_snapshot
from tbmem.snapshot.safe_pickle import load_plain
from tbmem.snapshot.schema import Snapshot, read_json_gz, user_frame_index

__all__ = ["load_snapshot", "load_torch_pickle", "snapshot_stats", "format_bytes", "is_pickle_path"]

_PICKLE_EXTS = (".pickle", ".pkl", ".pt")


def is_pickle_path(path: str) -> bool:
    """Whether a path names a pickle (by extension)."""
    return str(path).lower().endswith(_PICKLE_EXTS)


def load_torch_pickle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a PyTorch memory snapshot pickle as plain data; nothing in the file can run.

    Raises:
        tbmem.snapshot.safe_pickle.UnsafePickleError: the file names a Python object.
        ValueError: the file is plain data but not a snapshot.
    """
    path = os.fspath(path)
    data = load_plain(path)
    if not isinstance(data, dict) or "segments" not in data:
        raise ValueError(f"{path} is not a torch.cuda.memory._snapshot() pickle")
    return data


def load_snapshot(path: str | os.PathLike[str], *, allow_pickle: bool = True) -> Snapshot:
    """Load a tbmem ``.json.gz`` snapshot or a PyTorch pickle (read as plain data, never run).

    Args:
        path: The file.
        allow_pickle: False refuses pickles (for callers that want tbmem's own files only).

    Raises:
        ValueError: the file is not a valid snapshot, or is a pickle and ``allow_pickle`` is False.
        tbmem.snapshot.safe_pickle.UnsafePickleError: a pickle names a Python object.
    """
    path = os.fspath(path)
    if is_pickle_path(path):
        if not allow_pickle:
            raise ValueError(f"not reading {path}: pickles were not allowed by the caller")
        return convert_torch_snapshot(load_torch_pickle(path), kind="snapshot", step=0)
    return read_json_gz(path)


def format_bytes(n: float) -> str:
    """Human-readable binary size (``1.5 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _frame_label(snap: Snapshot, fid: int) -> str:
    if fid < 0:
        return "(no stack)"
    filename, line, name = snap.frame(fid)
    return f"{name} ({filename}:{line})"


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["", title, "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return out


def snapshot_stats(snap: Snapshot, *, top: int = 10) -> str:
    """Top allocations by size, by stack frame and by category, as terminal text."""
    a = snap.allocs
    peak_event, peak = snap.peak()
    alive = np.zeros(snap.n_allocs, dtype=bool)
    alive[snap.alive_at(peak_event)] = True
    lines = [f"{snap.kind} step {snap.step} rank {snap.rank}: {snap.source} on {snap.device}, "
             f"{snap.n_events} events, {snap.n_allocs} allocations, peak {format_bytes(peak)} at event "
             f"{peak_event}" + (f" ({snap.dropped} older events dropped)" if snap.dropped else "")]
    if "exception" in snap.meta:
        lines.append(f"exception: {snap.meta['exception']}")
    order = np.argsort(-a["size"], kind="stable")[:top]
    lines += _table(f"Top {len(order)} allocations by size", ("size", "category", "at peak", "allocated at"), [
        (format_bytes(int(a["size"][i])), snap.categories[a["category"][i]], "yes" if alive[i] else "no",
         _frame_label(snap, user_frame_index(snap, int(a["stack"][i])))) for i in order])
    user = {s: user_frame_index(snap, s) for s in set(a["stack"].tolist())}
    by_frame: dict[int, list[int]] = {}
    for i, (s, size) in enumerate(zip(a["stack"].tolist(), a["size"].tolist())):
        row = by_frame.setdefault(user[s], [0, 0, 0])
        row[0] += 1
        row[1] += size
        row[2] += size if alive[i] else 0
    frames = sorted(by_frame.items(), key=lambda kv: (-kv[1][2], -kv[1][1]))[:top]
    lines += _table("Top stack frames (innermost frame outside torch/tbmem)",
                    ("at peak", "allocated", "count", "frame"),
                    [(format_bytes(r[2]), format_bytes(r[1]), str(r[0]), _frame_label(snap, f)) for f, r in frames])
    cats = []
    for c, name in enumerate(snap.categories):
        m = a["category"] == c
        cats.append((int(a["size"][m & alive].sum()), int(a["size"][m].sum()), int(m.sum()), name))
    cats.sort(reverse=True)
    lines += _table("By category", ("at peak", "allocated", "count", "category"),
                    [(format_bytes(p), format_bytes(t), str(n), name) for p, t, n, name in cats])
    return "\n".join(lines)
