"""The offline snapshot viewer: one self-contained HTML file per snapshot.

The page inlines its own script and style (written for tbmem, no third-party
code), forbids every network request through a Content-Security-Policy, and
embeds the snapshot as JSON in a ``<script type="application/json">`` tag with
``<``, ``>`` and ``&`` escaped as ``\\u003c``, ``\\u003e``, ``\\u0026``, so no
snapshot string can close the tag; the script renders strings with
``textContent`` only. The timeline is aggregated to one column per pixel
(each column shows the state at its highest total, so the peak is exact) and
the hover looks up the exact allocation under the cursor.

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

from tbmem.snapshot.schema import Snapshot, to_json

__all__ = ["render_html", "write_html", "embed_json"]

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


def render_html(snap: Snapshot) -> str:
    """The viewer page for one snapshot."""
    template, css, js = _assets()
    title = html.escape(f"tbmem snapshot {snap.kind} step {snap.step} rank {snap.rank}")
    head, _, rest = template.partition("{{DATA}}")
    # substitute the data last and once, so nothing inside it is ever interpreted as a placeholder
    head = head.replace("{{TITLE}}", title).replace("{{CSS}}", css)
    rest = rest.replace("{{JS}}", js)
    return head + embed_json(to_json(snap)) + rest


def write_html(snap: Snapshot, path: str) -> str:
    """Write the viewer page for ``snap`` to ``path`` (plain write; the manager writes atomically)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(snap))
    return path
