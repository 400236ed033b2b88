"""What is alive in snapshot B and not in snapshot A: ``tbmem snapshot diff A B``, by allocation site and category.

For each device both snapshots have, the allocations alive when each snapshot was taken (or
at each one's peak, ``at="peak"``) are grouped by *site* (the innermost user frame of their
stack, as ``stats`` names it) and category; a site's growth is its bytes in B minus its bytes
in A. An allocation of B is *new* unless A holds one at the same address with the same size
and site (the same tensor still alive, as between two steps of one process): so ``new_bytes``
says how much of a site's memory in B was allocated since A, even where its total did not grow
(those sites are listed apart, as *reallocated*: "grew" holds only sites with more bytes in B).
The viewer computes the same table in the browser for any two snapshots of a page.

``diff_doc`` is the ``--json`` document::

    {"at": "end" | "peak", "devices": [{"device": "cuda:0",
       "a": {"allocated_bytes", "reserved_bytes", "count"}, "b": {...}, "delta_bytes": int,
       "grew": [SITE], "reallocated": [SITE], "shrank": [SITE]}]}
    SITE = {"label": str, "frame": {"filename", "line", "name"} | null, "category": str,
            "a_bytes", "b_bytes", "delta_bytes", "a_count", "b_count", "new_bytes", "new_count": int}

Example:
    >>> from tbmem._internal.snapshot.schema import SnapshotBuilder
    >>> from tbmem._internal.snapshot.diff import diff_doc
    >>> def snap(n):
    ...     b = SnapshotBuilder(source="dispatch", device="cpu")
    ...     for i in range(n):
    ...         b.alloc(1024, category="activation", stack=[("/u/train.py", 9, "step")], time_us=i, addr=4096 * i)
    ...     return b.build(kind="snapshot", step=n)
    >>> row = diff_doc(snap(2), snap(5))["devices"][0]["grew"][0]
    >>> row["label"], row["delta_bytes"], row["new_count"]
    ('step (/u/train.py:9)', 3072, 3)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from tbmem._internal.snapshot.model import FLAG_FREE_SITE, Device, Snapshot
from tbmem._internal.snapshot.stats import attribution, frame_kinds

__all__ = ["diff_doc", "diff_text", "site_labels"]


def site_labels(snap: Snapshot, dev: Device, idx: np.ndarray) -> list[str]:
    """Per allocation ``idx`` of ``dev``: the label of its site (``name (file:line)``; or how it is unknown)."""
    user = attribution(snap, frame_kinds(snap))
    cache: dict[tuple[int, bool], str] = {}
    out = []
    for sid, flags in zip(dev.allocs["stack"][idx].tolist(), dev.allocs["flags"][idx].tolist()):
        key = (sid, bool(flags & FLAG_FREE_SITE))
        text = cache.get(key)
        if text is None:
            if sid < 0:
                text = "(no stack recorded)"
            elif user[sid] < 0:
                text = "(no user frame)"
            else:
                f, line, name = snap.frame(int(user[sid]))
                text = f"{name} ({f}:{line})"
            if key[1]:
                text = f"(allocated before the trace; stack of its free) {text}"
            cache[key] = text
        out.append(text)
    return out


def _frame_of(snap: Snapshot, dev: Device, user: np.ndarray, i: int) -> dict[str, Any] | None:
    sid = int(dev.allocs["stack"][i])
    if sid < 0 or user[sid] < 0 or dev.allocs["flags"][i] & FLAG_FREE_SITE:
        return None
    f, line, name = snap.frame(int(user[sid]))
    return {"filename": f, "line": line, "name": name}


def _alive(dev: Device, at: str) -> np.ndarray:
    return dev.alive_at(dev.peak()[0]) if at == "peak" else np.flatnonzero(dev.allocs["end"] < 0)


def _device_diff(a: Snapshot, da: Device, b: Snapshot, db: Device, top: int, at: str) -> dict[str, Any]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    frames: dict[tuple[str, str], Any] = {}
    seen: Counter[tuple[int, int, str]] = Counter()
    for side, snap, dev in (("a", a, da), ("b", b, db)):
        alive = _alive(dev, at)
        labels = site_labels(snap, dev, alive)
        user = attribution(snap, frame_kinds(snap))
        al = dev.allocs
        for i, label in zip(alive.tolist(), labels):
            key = (label, snap.categories[int(al["category"][i])])
            row = rows.setdefault(key, {"a_bytes": 0, "b_bytes": 0, "a_count": 0, "b_count": 0, "new_bytes": 0,
                                        "new_count": 0})
            size = int(al["size"][i])
            row[f"{side}_bytes"] += size
            row[f"{side}_count"] += 1
            if key not in frames:
                frames[key] = _frame_of(snap, dev, user, i)
            ident = (int(al["addr"][i]), size, label)
            if side == "a":
                seen[ident] += 1
            elif seen[ident] > 0:
                seen[ident] -= 1
            else:
                row["new_bytes"] += size
                row["new_count"] += 1
    sites = [{"label": k[0], "frame": frames[k], "category": k[1], **r, "delta_bytes": r["b_bytes"] - r["a_bytes"]}
             for k, r in rows.items()]
    grew = sorted((s for s in sites if s["delta_bytes"] > 0),
                  key=lambda s: (-s["delta_bytes"], -s["new_bytes"], s["label"]))[:top]
    # as many bytes as in A, some allocated since: churn, not growth (under "Grew" they read "+0 B")
    reallocated = sorted((s for s in sites if s["delta_bytes"] == 0 and s["new_bytes"] > 0),
                         key=lambda s: (-s["new_bytes"], s["label"]))[:top]
    shrank = sorted((s for s in sites if s["delta_bytes"] < 0), key=lambda s: (s["delta_bytes"], s["label"]))[:top]

    def totals(dev: Device) -> dict[str, Any]:
        alive = _alive(dev, at)
        return {"allocated_bytes": int(dev.allocs["size"][alive].sum()), "count": int(alive.shape[0]),
                "reserved_bytes": dev.reserved_bytes}

    ta, tb = totals(da), totals(db)
    return {"device": da.name, "a": ta, "b": tb, "delta_bytes": tb["allocated_bytes"] - ta["allocated_bytes"],
            "grew": grew, "reallocated": reallocated, "shrank": shrank}


def diff_doc(a: Snapshot, b: Snapshot, *, top: int = 20, device: str | None = None, at: str = "end") -> dict[str, Any]:
    """The ``--json`` document (module docstring); ValueError names a device neither has."""
    if at not in ("end", "peak"):
        raise ValueError(f"at must be 'end' or 'peak', not {at!r}")
    names_a = {d.name: d for d in a.devices if d.name}
    names_b = {d.name: d for d in b.devices if d.name}
    if device is not None:
        name = device if device in names_a or device in names_b else f"cuda:{device}"
        if name not in names_a and name not in names_b:
            raise ValueError(f"no device {device!r} in either snapshot (devices: "
                             f"{', '.join(sorted(set(names_a) | set(names_b))) or 'none'})")
        wanted = [name]
    else:
        wanted = sorted(set(names_a) | set(names_b))
    out = []
    for name in wanted:
        empty = Device(name=name, time_us=np.zeros(0, dtype=np.int64),
                       allocs={c: np.zeros(0, dtype=np.int64) for c in ("start", "end", "size")})
        out.append(_device_diff(a, names_a.get(name, empty), b, names_b.get(name, empty), top, at))
    return {"at": at, "devices": out}


def diff_text(a: Snapshot, b: Snapshot, *, top: int = 20, device: str | None = None, at: str = "end",
              names: tuple[str, str] = ("A", "B")) -> str:
    """Terminal text of :func:`diff_doc`: per device the totals, then what grew and what shrank."""
    from tbmem._internal.snapshot.stats import format_bytes as fmt

    doc = diff_doc(a, b, top=top, device=device, at=at)
    when = "when each snapshot was taken" if at == "end" else "at each snapshot's peak"
    lines = [f"alive in B ({names[1]}) against A ({names[0]}), {when}"]
    for d in doc["devices"]:
        sign = "+" if d["delta_bytes"] >= 0 else "-"
        res = "" if d["a"]["reserved_bytes"] is None and d["b"]["reserved_bytes"] is None else (
            f"; reserved {fmt(d['a']['reserved_bytes'] or 0)} -> {fmt(d['b']['reserved_bytes'] or 0)}")
        lines += ["", f"== {d['device']}: allocated {fmt(d['a']['allocated_bytes'])} ({d['a']['count']}) -> "
                      f"{fmt(d['b']['allocated_bytes'])} ({d['b']['count']}), {sign}{fmt(abs(d['delta_bytes']))}{res}"]
        for title, rows in (("Grew (largest first; new: allocated since A)", d["grew"]),
                            ("Same size, allocated again since A", d["reallocated"]),
                            ("Shrank", d["shrank"])):
            if not rows:
                continue
            table = [(("+" if r["delta_bytes"] >= 0 else "-") + fmt(abs(r["delta_bytes"])), fmt(r["a_bytes"]),
                      fmt(r["b_bytes"]), fmt(r["new_bytes"]) + f" ({r['new_count']})", r["category"], r["label"])
                     for r in rows]
            header = ("change", "in A", "in B", "new in B", "category", "allocated at")
            widths = [max(len(h), *(len(t[k]) for t in table)) for k, h in enumerate(header)]
            lines += ["", title, "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
            lines += ["  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip() for t in table]
    return "\n".join(lines)
