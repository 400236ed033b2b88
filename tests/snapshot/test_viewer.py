"""The offline viewer in headless Chromium with every network request blocked."""

from __future__ import annotations

import os

import pytest

from tbmem.snapshot.viewer import render_html
from tests.snapshot._helpers import EVIL, small_snapshot

CHROMIUM = "/usr/bin/chromium"
from playwright import sync_api  # noqa: E402

# Skipped only on a developer machine without Debian's chromium; CI sets TBMEM_REQUIRE_BROWSER=1.
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("TBMEM_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, path):
    """Open a file page with every request except the page itself blocked; return page, requests, errors."""
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    requests, errors = [], []
    url = "file://" + str(path)

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("window.tbmemViewer !== undefined")
    return page, requests, errors


def _drawn_pixels(page) -> int:
    return page.evaluate("""() => {
        const c = document.getElementById('timeline');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i + 2] > d[i] + 40) n++;  // bluish/coloured, not white/grey
        return n;
    }""")


def test_timeline_renders_and_hover_shows_frame(browser, tmp_path):
    snap = small_snapshot()
    path = tmp_path / "view.html"
    path.write_text(render_html(snap), encoding="utf-8")
    page, requests, errors = _open(browser, path)
    assert _drawn_pixels(page) > 500
    stats = page.evaluate("window.tbmemViewer.stats()")
    assert stats["peak"] == snap.peak_bytes() and stats["peakEvent"] == snap.peak()[0]
    pt = page.evaluate("window.tbmemViewer.peakPoint()")
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + pt["x"], box["y"] + pt["y"])
    page.wait_for_selector("#tooltip:not([hidden])")
    tip = page.inner_text("#tooltip")
    assert "forward (/home/u/train.py:" in tip and "main (/home/u/main.py:5)" in tip
    # the peak table lists every allocation alive at the peak, largest first
    rows = page.locator("#peak tbody tr")
    assert rows.count() == len(snap.alive_at(snap.peak()[0]))
    assert rows.first.inner_text().startswith("40.00 KiB")
    assert requests == [] and errors == []
    page.close()


def test_filters_change_the_drawing(browser, tmp_path):
    snap = small_snapshot()
    path = tmp_path / "view.html"
    path.write_text(render_html(snap), encoding="utf-8")
    page, requests, errors = _open(browser, path)
    before = page.evaluate("window.tbmemViewer.stats()")["peak"]
    page.fill("#minsize", "30")
    page.dispatch_event("#minsize", "change")
    a = snap.allocs
    alive = snap.alive_at(snap.peak()[0])
    expected = int(sum(int(a["size"][i]) for i in alive if a["size"][i] >= 30 * 1024))
    assert page.evaluate("window.tbmemViewer.stats()")["peak"] == expected < before
    page.locator("#categories input").first.uncheck()
    assert page.evaluate("window.tbmemViewer.stats()")["peak"] < expected
    assert requests == [] and errors == []
    page.close()


def test_script_in_frame_name_renders_as_text(browser, tmp_path):
    snap = small_snapshot(frame_name=EVIL)
    html = render_html(snap)
    assert EVIL not in html
    path = tmp_path / "evil.html"
    path.write_text(html, encoding="utf-8")
    page, requests, errors = _open(browser, path)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    assert page.locator("#peak script").count() == 0 and page.locator("body script").count() == 2
    assert EVIL in page.inner_text("#peak")
    pt = page.evaluate("window.tbmemViewer.peakPoint()")
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + pt["x"], box["y"] + pt["y"])
    page.wait_for_selector("#tooltip:not([hidden])")
    assert EVIL in page.inner_text("#tooltip")
    assert dialogs == [] and requests == [] and errors == []
    page.close()
