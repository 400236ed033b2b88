"""The offline snapshot viewer: one self-contained HTML file for one or several snapshots, every device.

The page inlines its own script and style (written for tbmem, no third-party code; the script
is the ``viewer_*.js`` files in order, inside one function), forbids every network request
through a Content-Security-Policy, and embeds the snapshots as JSON in ``<script
type="application/json">`` tags with ``<``, ``>`` and ``&`` escaped as ``\\u003c``,
``\\u003e``, ``\\u0026``, so no snapshot string can close the tag; the script renders strings
with ``textContent`` only. A small first document (titles, each device's overview of 2048
columns and its explain line) draws at once; the large one holds the columns,
zlib-compressed and base64-encoded (event times and allocation starts as differences, ends
as lifetimes, addresses as multiples of 512 from the lowest), inflated by the browser's own
``DecompressionStream``. Which frame of a stack is the user's is decided here, in Python
(:mod:`tbmem._internal.snapshot.frames`), and shipped with the page; so are the category colours
(:data:`PALETTE`, the Memory tab's).

Example:
    >>> from tbmem._internal.snapshot.schema import SnapshotBuilder
    >>> from tbmem._internal.snapshot.viewer import render_html
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
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from tbmem._internal.oom.census import oom_census
from tbmem._internal.oom.explain import explain_device
from tbmem._internal.oom.text import explanation_text
from tbmem._internal.palette import CATEGORY_COLORS
from tbmem._internal.snapshot.allocator import allocator_state
from tbmem._internal.snapshot.columns import encode_column
from tbmem._internal.snapshot.frames import KINDS
from tbmem._internal.snapshot.model import SEGMENT_COLUMNS, Device, Snapshot
from tbmem._internal.snapshot.stats import attribution, frame_kinds, generated_frames

__all__ = ["render_html", "write_html", "embed_json", "page_docs", "PALETTE", "category_colours", "JS_FILES"]

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The viewer's script, in the order the page runs it (one function scope).
JS_FILES = ("viewer_base.js", "viewer_alive.js", "viewer_timeline.js", "viewer_allocator.js", "viewer_pools.js",
            "viewer_panels.js", "viewer_main.js")
#: The Memory tab's category colours (one palette for the tab, the viewer and report.png).
PALETTE = dict(CATEGORY_COLORS)
# which palette entry each snapshot category takes: what its allocations mostly are
_CATEGORY_PALETTE = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer_state",
                     "optimizer": "optimizer_state", "buffer": "buffers", "activation": "activations",
                     "python code": "activations", "c++ only": "other", "no stack": "unattributed",
                     "unknown": "unattributed"}
# categories the Memory tab has no entry for (recorded only in snapshots)
_EXTRA_COLOURS = {"backward": "#af7aa1", "no_grad": "#ff9da7", "before trace": "#9c755f",
                  "before_recording": "#9c755f"}
_OVERVIEW_COLUMNS = 2048


def category_colours(categories: Sequence[str]) -> dict[str, str]:
    """The colour of each category name (palette entries by meaning; others by a stable hash)."""
    out = {}
    for name in categories:
        if name in _CATEGORY_PALETTE:
            out[name] = PALETTE[_CATEGORY_PALETTE[name]]
        elif name in PALETTE:
            out[name] = PALETTE[name]
        elif name in _EXTRA_COLOURS:
            out[name] = _EXTRA_COLOURS[name]
        else:
            h = 0
            for ch in name:
                h = (h * 31 + ord(ch)) & 0xFFFFFFFF
            out[name] = f"hsl({h % 360},55%,55%)"
    return out


@lru_cache(maxsize=1)
def _assets() -> tuple[str, str, str]:
    def read(name: str) -> str:
        with open(os.path.join(_HERE, name), encoding="utf-8") as fh:
            return fh.read()

    js = "".join(f"// --- {name}\n{read(name)}\n" for name in JS_FILES)
    return read("viewer.html"), read("viewer.css"), "(function () {\n\"use strict\";\n" + js + "})();"


def embed_json(doc: object) -> str:
    """Compact JSON that is safe inside a ``<script>`` element (no ``<``, ``>`` or ``&``)."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    # these characters can only occur inside JSON strings, where \\uXXXX means the same character
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _delta(arr: np.ndarray) -> np.ndarray:
    return np.diff(arr, prepend=0) if arr.shape[0] else arr


def _overview(n_bands: int, d: Device) -> dict[str, Any] | None:
    """Each of 2048 columns at its highest point, bands by category: the most
    bytes alive across the column (its events, and the state carried in from before it), so a
    column with no event shows what stayed alive, never the spike before it."""
    n = d.n_events
    if n == 0:
        return None
    a = d.allocs
    band = a["category"]
    delta = np.zeros(n, dtype=np.int64)
    band_of_event = np.zeros(n, dtype=np.uint8 if n_bands <= 256 else np.int32)
    s, e = a["start"], a["end"]
    delta[s[s >= 0]] = a["size"][s >= 0]
    band_of_event[s[s >= 0]] = band[s >= 0]
    delta[e[e >= 0]] -= a["size"][e >= 0]
    band_of_event[e[e >= 0]] = band[e >= 0]
    base = d.baseline_bytes()
    total = np.cumsum(delta)
    total += base
    timed = d.has_time and n > 1 and d.time_us.max() > d.time_us[0]
    if timed:
        t = np.maximum.accumulate(d.time_us)
        t -= t[0]
        col = np.minimum(_OVERVIEW_COLUMNS - 1, (t * _OVERVIEW_COLUMNS) // max(int(t[-1]), 1)).astype(np.int32)
        del t
    else:
        col = ((np.arange(n, dtype=np.int64) * _OVERVIEW_COLUMNS) // n).astype(np.int32)
    # per column: the event of its highest total, or the state carried in (event -1 = the baseline)
    first = np.searchsorted(col, np.arange(_OVERVIEW_COLUMNS), side="left")
    last = np.searchsorted(col, np.arange(_OVERVIEW_COLUMNS), side="right")
    del col
    best_ev = first - 1  # the event whose state a column starts with
    for c in np.flatnonzero(last > first).tolist():
        i = int(first[c]) + int(np.argmax(total[first[c]:last[c]]))  # the first of its highest
        carried = int(total[first[c] - 1]) if first[c] > 0 else base
        if int(total[i]) >= carried:
            best_ev[c] = i
    del total
    # each band's bytes at each column's chosen event: sums of the deltas between consecutive chosen
    # events (one bincount, in float64: exact below 2**53 bytes, and this only draws the first paint)
    init = np.bincount(band[a["start"] < 0], weights=a["size"][a["start"] < 0], minlength=n_bands)
    ev_sorted = np.maximum.accumulate(best_ev)  # non-decreasing already; -1 for the leading baseline columns
    bounds = np.clip(np.concatenate(([0], ev_sorted + 1, [n])), 0, n)
    key = np.repeat(np.arange(_OVERVIEW_COLUMNS + 1, dtype=np.int32) * n_bands, np.diff(bounds))
    key += band_of_event
    sums = np.bincount(key, weights=delta, minlength=(_OVERVIEW_COLUMNS + 1) * n_bands)
    cum = init + np.cumsum(sums.reshape(-1, n_bands)[:_OVERVIEW_COLUMNS], axis=0)
    bands = np.rint(cum.T).astype(np.int64).tolist()
    return {"bands": bands, "axis": "time" if timed else "event"}


def _addresses(d: Device) -> tuple[int, int]:
    """(base, alignment) of the device's addresses: every address is base + k * alignment."""
    parts = [d.allocs["addr"]] + ([d.segs["addr"]] if d.segs is not None else [])
    allv = np.concatenate(parts)
    if not allv.shape[0]:
        return 0, 1
    base = int(allv.min())
    return base, 512 if bool(np.all((allv - base) % 512 == 0)) else 1


def _ooms_explained(snap: Snapshot, d: Device) -> list[dict[str, Any]]:
    """The device's OOMs, each with ``why``: the explanation block (tbmem._internal.oom) the page shows at its top."""
    if not d.ooms:
        return []
    sites = attribution(snap)
    return [{**o, "why": explanation_text(explain_device(
        d, o, categories=snap.categories, strings=snap.strings, frames=snap.frames, stacks=snap.stacks,
        settings=snap.meta.get("allocator_settings"), site_of_stack=sites, rank=snap.rank, step=snap.step,
        census=oom_census(snap)))}
        for o in d.ooms]


def _device_doc(snap: Snapshot, d: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what draws at once, the columns) of one device."""
    a = d.allocs
    names = ("start", "end", "size", "category", "stack", "flags", "freereq", "round", "addr")
    st, en = a["start"], a["end"]
    if bool(np.all((st[1:] > st[:-1]) | ((st[1:] == st[:-1]) & (en[1:] >= en[:-1])))):
        cols = {c: a[c] for c in names}  # by start, then end, already (as tbmem's conversion writes it)
    else:
        order = np.lexsort((en, st))  # by start: start differences stay small
        cols = {c: a[c][order] for c in names}
    base_ev = np.maximum(cols["start"], 0)
    # starts as differences (+1: the -1 of "before the trace" sorts first), ends as distances from
    # the start (0: none), addresses as multiples of the alignment from the base
    # free requests as distances back from the end (mostly 1: requested, then completed), or from the
    # start while alive; rounding as its difference from the allocator's least rounding (mostly 0)
    cols["freereq"] = np.where(cols["freereq"] < 0, 0, np.where(cols["end"] >= 0, cols["end"] - cols["freereq"],
                                                             cols["freereq"] - base_ev) + 1)
    cols["round"] = cols["round"] - (np.maximum(512, (cols["size"] + 511) // 512 * 512) - cols["size"])
    cols["end"] = np.where(cols["end"] >= 0, cols["end"] - np.where(cols["start"] >= 0, cols["start"], -1), 0)
    cols["start"] = _delta(cols["start"] + 1)
    addr_base, align = _addresses(d)
    cols["addr"] = (cols["addr"] - addr_base) // align
    explain = allocator_state(d, d.n_events - 1, snap.categories).to_json() if d.segs is not None else None
    head = {"device": d.name, "n_events": d.n_events, "n_allocs": d.n_allocs, "has_time": bool(d.has_time),
            "dropped": d.dropped, "reserved_bytes": d.reserved_bytes, "segments": d.segments, "ooms": _ooms_explained(snap, d),
            "markers": d.markers, "peak": list(d.peak()), "final_bytes": d.final_bytes(),
            "baseline_bytes": d.baseline_bytes(), "baseline_reserved": d.baseline_reserved(),
            "overview": _overview(len(snap.categories), d), "explain": explain,
            "addr_base": addr_base, "addr_align": align, "has_segments": d.segs is not None,
            "streams": [int(s) for s in d.streams], "pools": [list(p) for p in d.pools]}
    seg: dict[str, np.ndarray] = {}
    if d.segs is not None:
        s = d.segs
        so = np.lexsort((s["start"], s["addr"]))
        seg = {c: s[c][so] for c in SEGMENT_COLUMNS}
        seg["addr"] = (seg["addr"] - addr_base) // align
    # zlib releases the GIL: the columns are compressed side by side
    jobs = {("time_us", ""): _delta(d.time_us), **{("cols", c): v for c, v in cols.items()},
            **{("segs", c): v for c, v in seg.items()}}
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        done = dict(zip(jobs, pool.map(lambda v: encode_column(v, compress=True), jobs.values())))
    body: dict[str, Any] = {"time_us": done[("time_us", "")],
                            "cols": {c: done[("cols", c)] for c in cols}}
    if d.segs is not None:
        body["segs"] = {c: done[("segs", c)] for c in seg}
    return head, body


def page_docs(snaps: Sequence[Snapshot], *, names: Sequence[str] | None = None,
              device: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two JSON documents the page embeds: what draws at once, and the columns."""
    heads, bodies, categories = [], [], set()
    for k, snap in enumerate(snaps):
        kinds = frame_kinds(snap)
        default = snap.device_index(device) if device is not None and k == 0 else snap.default_device
        parts = [_device_doc(snap, d) for d in snap.devices]
        categories.update(snap.categories)
        name = names[k] if names is not None and k < len(names) else f"{snap.kind} step {snap.step} rank {snap.rank}"
        heads.append({"name": name, "kind": snap.kind, "step": snap.step, "rank": snap.rank, "source": snap.source,
                      "t0_unix": snap.t0_unix, "categories": snap.categories, "default_device": default,
                      "devices": [h for h, _b in parts],
                      "meta": {k2: v for k2, v in snap.meta.items() if k2 in ("exception", "recorder", "torch")}})
        bodies.append({"strings": snap.strings, "frames": snap.frames, "stacks": snap.stacks,
                       "frame_kinds": kinds.tolist(), "user_frame": attribution(snap, kinds).tolist(),
                       "gen_frame": generated_frames(snap, kinds).tolist(), "devices": [b for _h, b in parts]})
    head = {"snapshots": heads, "colours": category_colours(sorted(categories)), "kinds": list(KINDS)}
    return head, {"snapshots": bodies}


def render_html(snap: Snapshot | Sequence[Snapshot], *, device: str | None = None,
                names: Sequence[str] | None = None) -> str:
    """The viewer page for one snapshot or several (``device``: the first one's device shown first;
    default: the OOM device, else the largest peak; ``names``: how the page names each snapshot)."""
    snaps = [snap] if isinstance(snap, Snapshot) else list(snap)
    if not snaps:
        raise ValueError("no snapshot to show")
    template, css, js = _assets()
    first = snaps[0]
    title = html.escape(f"tbmem snapshot {first.kind} step {first.step} rank {first.rank}"
                        + (f" and {len(snaps) - 1} more" if len(snaps) > 1 else ""))
    head_doc, body_doc = page_docs(snaps, names=names, device=device)
    page_head, _, rest = template.partition("{{HEAD}}")
    middle, _, tail = rest.partition("{{DATA}}")
    # substitute the data last and once, so nothing inside it is ever interpreted as a placeholder
    page_head = page_head.replace("{{TITLE}}", title).replace("{{CSS}}", css)
    middle = middle.replace("{{JS}}", js)
    return page_head + embed_json(head_doc) + middle + embed_json(body_doc) + tail


def write_html(snap: Snapshot | Sequence[Snapshot], path: str) -> str:
    """Write the viewer page for ``snap`` to ``path`` (plain write; the manager writes atomically)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(snap))
    return path
