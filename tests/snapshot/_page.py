"""The snapshot viewer in headless Chromium with every request but the page's own blocked (for the viewer tests)."""

from __future__ import annotations

import os
from typing import Any

from tbmem._internal.snapshot.viewer import render_html
from tests._browser import wait_until

__all__ = ["open_page", "_open", "write_page", "hover_peak", "hover_at", "drawn_pixels", "filled_pixels", "READY"]

#: The page has decoded its default device, drawn the exact timeline and the allocator view at the peak.
READY = "window.tbmemViewer !== undefined && window.tbmemViewer.exact && window.tbmemViewer.state.allocDrawn === true"


def open_page(browser: Any, path: Any, *, width: int = 1100, height: int = 900) -> tuple[Any, list[str], list[str]]:
    """Open a file page with every other request blocked; return (page, blocked requests, console errors)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    requests: list[str] = []
    errors: list[str] = []
    url = "file://" + os.path.abspath(str(path))

    def route(r: Any) -> None:
        if r.request.url == url:
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    wait_until(page, READY, timeout_s=120)
    return page, requests, errors


_open = open_page  # the name test_real.py imports


def write_page(tmp_path: Any, snap: Any, name: str = "view.html", **kwargs: Any) -> Any:
    """Write the viewer page of ``snap`` (one snapshot or a list) under ``tmp_path``; its path."""
    path = tmp_path / name
    path.write_text(render_html(snap, **kwargs), encoding="utf-8")
    return path


def hover_at(page: Any, x: float, y: float, canvas: str = "#timeline") -> str:
    """Move the mouse to (x, y) CSS pixels of a canvas; the tooltip's text."""
    box = page.locator(canvas).bounding_box()
    page.mouse.move(0, 0)
    page.mouse.move(box["x"] + x, box["y"] + y)
    page.wait_for_selector("#tooltip:not([hidden])")
    return page.inner_text("#tooltip")


def hover_peak(page: Any) -> str:
    """Move the mouse over the peak column; the tooltip's text."""
    pt = page.evaluate("window.tbmemViewer.peakPoint()")
    return hover_at(page, pt["x"], pt["y"])


def drawn_pixels(page: Any, canvas: str = "timeline") -> int:
    """Coloured (not white or grey) pixels of a canvas."""
    return page.evaluate("""(id) => {
        const c = document.getElementById(id);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 40) n++;
        return n;
    }""", canvas)


def filled_pixels(page: Any, canvas: str = "timeline") -> int:
    """Pixels of a chart's plot area (inside its axes; all of the segment map) that something was drawn on:
    neither white, nor a grid line, nor a segment's free bytes."""
    return page.evaluate("""(id) => {
        const c = document.getElementById(id), dpr = window.devicePixelRatio || 1, map = id === 'segments';
        const x0 = map ? 0 : Math.ceil(78 + 2 * dpr), x1 = map ? c.width : c.width - 12;
        const y0 = map ? 0 : 18, y1 = map ? c.height : c.height - 34 - 2;
        const d = c.getContext('2d').getImageData(x0, y0, x1 - x0, y1 - y0).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (Math.min(d[i], d[i + 1], d[i + 2]) < 225) n++;
        return n;
    }""", canvas)
