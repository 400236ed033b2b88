"""The offline snapshot viewer: one self-contained HTML file per snapshot, every device in it.

The page inlines its own script and style (written for tbmem, no third-party code), forbids
every network request through a Content-Security-Policy, and embeds the snapshot as JSON in a
``<script type="application/json">`` tag with ``<``, ``>`` and ``&`` escaped as ``\\u003c``,
``\\u003e``, ``\\u0026``, so no snapshot string can close the tag; the script renders strings
with ``textContent`` only. Large columns travel zlib-compressed and base64-encoded (event
times and allocation starts as differences, ends as lifetimes), inflated by the browser's own
``DecompressionStream``: a ten-million-event snapshot makes a page of tens of MB that draws
in about a second. Which frame of a stack is the user's is decided here, in Python
(:mod:`tbmem.snapshot.frames`), and shipped with the page.

Example:
    >>> from tbmem.snapshot.schema import SnapshotBuilder
    >>> from tbmem.snapshot.viewer import render_html
    >>> b = SnapshotBuilder(source="dispatch", device="cpu")
    >>> _ = b.alloc(64, stack=[("x.py", 1, "<script>alert(1)</script>")], time_us=0)
    >>> page = render_html(b.build(kind="snapshot", step=0))
    >>> "<script>alert" in page, "\\\\u003cscript\\\\u003ealert(1)" in page
    (False, True)
"""

from __future__ import annotations

import html
import json
import os
from functools import lru_cache
from typing import Any

import numpy as np

from tbmem.snapshot.schema import COLUMNS, Snapshot, encode_column
from tbmem.snapshot.stats import attribution, frame_kinds

__all__ = ["render_html", "write_html", "embed_json", "page_doc"]

_HERE = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=1)
def _assets() -> tuple[str, str, str]:
    def read(name: str) -> str:
        with open(os.path.join(_HERE, name), encoding="utf-8") as fh:
            return fh.read()

    return read("viewer.html"), read("viewer.css"), read("viewer.js")


def embed_json(doc: object) -> str:
    """Compact JSON that is safe inside a ``<script>`` element (no ``<``, ``>`` or ``&``)."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    # these characters can only occur inside JSON strings, where \\uXXXX means the same character
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _delta(arr: np.ndarray) -> np.ndarray:
    return np.diff(arr, prepend=0) if arr.shape[0] else arr


_OVERVIEW_COLUMNS = 2048


def _overview(snap: Snapshot, d: Any) -> dict[str, Any] | None:
    """Band totals at the highest point of each of 2048 columns (time axis when the trace has times),
    so that the page draws before it has inflated the columns; bands: categories, then the baseline."""
    n = d.n_events
    if n == 0:
        return None
    a = d.allocs
    base_band = len(snap.categories)
    band = np.where(a["start"] < 0, base_band, a["category"])
    delta = np.zeros(n, dtype=np.int64)
    band_of_event = np.zeros(n, dtype=np.int64)
    s, e = a["start"], a["end"]
    delta[s[s >= 0]] = a["size"][s >= 0]
    band_of_event[s[s >= 0]] = band[s >= 0]
    delta[e[e >= 0]] -= a["size"][e >= 0]
    band_of_event[e[e >= 0]] = band[e >= 0]
    total = d.baseline_bytes() + np.cumsum(delta)
    if d.has_time and n > 1 and d.time_us.max() > d.time_us[0]:
        t = np.maximum.accumulate(d.time_us)
        col = np.minimum(_OVERVIEW_COLUMNS - 1, ((t - t[0]) * _OVERVIEW_COLUMNS) // max(int(t[-1] - t[0]), 1))
    else:
        col = (np.arange(n) * _OVERVIEW_COLUMNS) // n
    starts = np.flatnonzero(np.concatenate(([True], col[1:] != col[:-1])))
    # the event of each column's highest total (first on ties)
    best = np.maximum.reduceat(total, starts)
    mark = total == np.repeat(best, np.diff(np.concatenate((starts, [n]))))
    first = np.maximum.reduceat(np.where(mark, -np.arange(n), -n), starts)
    events = -first
    bands = []
    for b in range(base_band + 1):
        mine = band == b
        init = int(a["size"][mine & (a["start"] < 0)].sum())
        cum = init + np.cumsum(np.where(band_of_event == b, delta, 0))
        bands.append(cum[events].tolist())
    return {"columns": col[starts].tolist(), "events": events.tolist(), "bands": bands,
            "axis": "time" if d.has_time and n > 1 and d.time_us.max() > d.time_us[0] else "event"}


def page_doc(snap: Snapshot, *, device: str | None = None) -> dict[str, Any]:
    """The JSON the page embeds: tables, attribution, and per device compressed columns."""
    kinds = frame_kinds(snap)
    default = snap.device_index(device) if device is not None else snap.default_device
    devices = []
    for d in snap.devices:
        a = d.allocs
        order = np.lexsort((a["end"], a["start"]))  # by start: start differences stay small
        cols = {c: a[c][order] for c in COLUMNS if c != "addr"}
        # starts as differences (+1: the -1 of "before the trace" sorts first), ends as lifetimes
        # (0: still alive): small numbers that compress well
        base = np.where(cols["start"] >= 0, cols["start"], -1)
        cols["end"] = np.where(cols["end"] >= 0, cols["end"] - base, 0)
        cols["start"] = _delta(cols["start"] + 1)
        devices.append({
            "device": d.name, "n_events": d.n_events, "n_allocs": d.n_allocs, "has_time": bool(d.has_time),
            "dropped": d.dropped, "reserved_bytes": d.reserved_bytes, "segments": d.segments,
            "ooms": d.ooms, "markers": d.markers, "peak": list(d.peak()), "final_bytes": d.final_bytes(),
            "baseline_bytes": d.baseline_bytes(), "overview": _overview(snap, d),
            "time_us": encode_column(_delta(d.time_us), compress=True),
            "cols": {c: encode_column(v, compress=True) for c, v in cols.items()}})
    return {"kind": snap.kind, "step": snap.step, "rank": snap.rank, "source": snap.source,
            "t0_unix": snap.t0_unix, "strings": snap.strings, "frames": snap.frames, "stacks": snap.stacks,
            "categories": snap.categories, "frame_kinds": kinds.tolist(), "user_frame": attribution(snap, kinds).tolist(),
            "default_device": default, "devices": devices,
            "meta": {k: v for k, v in snap.meta.items() if k in ("exception", "recorder", "torch")}}


def render_html(snap: Snapshot, *, device: str | None = None) -> str:
    """The viewer page for a snapshot (``device``: the one shown first; default: the OOM device,
    else the largest peak)."""
    template, css, js = _assets()
    title = html.escape(f"tbmem snapshot {snap.kind} step {snap.step} rank {snap.rank}")
    head, _, rest = template.partition("{{DATA}}")
    # substitute the data last and once, so nothing inside it is ever interpreted as a placeholder
    head = head.replace("{{TITLE}}", title).replace("{{CSS}}", css)
    rest = rest.replace("{{JS}}", js)
    return head + embed_json(page_doc(snap, device=device)) + rest


def write_html(snap: Snapshot, path: str) -> str:
    """Write the viewer page for ``snap`` to ``path`` (plain write; the manager writes atomically)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(snap))
    return path
