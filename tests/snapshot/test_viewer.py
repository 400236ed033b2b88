"""The offline viewer in headless Chromium with every network request blocked."""

from __future__ import annotations

import os

import pytest

from tests._browser import CHROMIUM, wait_until
from tbmem._internal.snapshot.viewer import render_html
from tests.snapshot._helpers import EVIL, small_snapshot
from tests.snapshot._page import _open, drawn_pixels, hover_peak

__all__ = ["_open", "drawn_pixels", "hover_peak"]  # test_real.py imports them from here

# Skipped only on a developer machine without Debian's chromium; CI sets TBMEM_REQUIRE_BROWSER=1.
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("TBMEM_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (apt-get install chromium)")


def test_timeline_renders_and_hover_shows_frame(browser, tmp_path):
    snap = small_snapshot()
    path = tmp_path / "view.html"
    path.write_text(render_html(snap), encoding="utf-8")
    page, requests, errors = _open(browser, path)
    assert drawn_pixels(page) > 500
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
    assert page.locator("#peak script").count() == 0 and page.locator("body script").count() == 3
    assert EVIL in page.inner_text("#peak")
    pt = page.evaluate("window.tbmemViewer.peakPoint()")
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + pt["x"], box["y"] + pt["y"])
    page.wait_for_selector("#tooltip:not([hidden])")
    assert EVIL in page.inner_text("#tooltip")
    assert dialogs == [] and requests == [] and errors == []
    page.close()


def _page(browser, tmp_path, snap, name="view.html"):
    path = tmp_path / name
    path.write_text(render_html(snap), encoding="utf-8")
    return _open(browser, path)


def test_colour_follows_the_category_name_not_its_order(browser, tmp_path):
    from tbmem._internal.snapshot.schema import SnapshotBuilder

    colours = []
    for order in (("backward", "optimizer"), ("optimizer", "backward")):
        b = SnapshotBuilder(source="cuda", device="cuda:0")
        for i, cat in enumerate(order):
            b.alloc(1024 * (i + 1), category=cat, time_us=i)
        page, requests, errors = _page(browser, tmp_path, b.build(kind="snapshot", step=0), f"{order[0]}.html")
        colours.append(page.evaluate("""() => { const out = {};
            document.querySelectorAll('#categories label').forEach(l => {
              out[l.textContent.trim()] = l.querySelector('.swatch').style.background; });
            return out; }"""))
        assert errors == [] and requests == []
        page.close()
    assert colours[0]["backward"] == colours[1]["backward"] and colours[0]["optimizer"] == colours[1]["optimizer"]
    assert colours[0]["backward"] != colours[0]["optimizer"]


def test_ticks_are_1_2_5_times_a_power_of_ten_of_one_binary_unit(browser, tmp_path):
    from tbmem._internal.snapshot.schema import SnapshotBuilder

    for total in (547.61 * 1024, 3 * 2**30 + 12345, 70_000):
        b = SnapshotBuilder(source="cuda", device="cuda:0")
        b.alloc(int(total), category="python code", time_us=0)
        page, _r, errors = _page(browser, tmp_path, b.build(kind="snapshot", step=0))
        ticks = page.evaluate("window.tbmemViewer.ticks()")
        units = {t.split()[1] for t in ticks}
        values = [float(t.split()[0]) for t in ticks]
        step = values[1] - values[0]
        mantissa = step / 10 ** __import__("math").floor(__import__("math").log10(step))
        assert len(units) == 1 and round(mantissa, 6) in (1.0, 2.0, 5.0) and values[0] == 0, ticks
        assert all(abs(v / step - round(v / step)) < 1e-9 for v in values) and errors == []
        page.close()


def test_tooltip_stays_inside_the_viewport_beside_the_event_line(browser, tmp_path):
    page, _r, errors = _page(browser, tmp_path, small_snapshot(n=200))
    box = page.locator("#timeline").bounding_box()
    x, y = box["x"] + box["width"] - 24, box["y"] + box["height"] - 60
    page.mouse.move(x, y)
    page.wait_for_selector("#tooltip:not([hidden])")
    tip = page.locator("#tooltip").bounding_box()
    vw = page.evaluate("document.documentElement.clientWidth")
    assert tip["x"] >= 0 and tip["x"] + tip["width"] <= vw
    assert not (tip["x"] <= x <= tip["x"] + tip["width"])  # the tooltip does not cover the event line
    dark = page.evaluate("""([cx]) => { const o = document.getElementById('overlay');
        const r = o.getBoundingClientRect(), sx = o.width / r.width;
        const px = Math.round((cx - r.left) * sx), d = o.getContext('2d').getImageData(px - 2, 0, 5, o.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 100) n++; return n; }""", [x])
    assert dark > 100 and errors == []


def test_devices_oom_marker_and_cpp_toggle(browser, tmp_path):
    from tbmem._internal.snapshot.cuda import convert_torch_snapshot
    from tests.snapshot._helpers import torch_dict

    data = torch_dict()
    unwind = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}
    cpp = {"filename": "??", "line": 0, "name": "at::native::empty_cuda()"}
    data["device_traces"][1][0]["frames"] = [unwind, cpp] + data["device_traces"][1][0]["frames"]
    page, requests, errors = _page(browser, tmp_path, convert_torch_snapshot(data, kind="oom", step=3))
    assert page.evaluate("window.tbmemViewer.device()") == "cuda:1"  # the OOM device first
    assert "OUT OF MEMORY" in page.inner_text("#summary") and "1.00 GiB" in page.inner_text("#summary")
    red = page.evaluate("""() => { const c = document.getElementById('timeline');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] > 190 && d[i + 1] < 40 && d[i + 2] < 40) n++; return n; }""")
    assert red > 50  # the OOM marker
    tip = hover_peak(page)
    assert "C++ frames hidden" in tip and "at::native::empty_cuda" not in tip and "torch::unwind" not in tip
    page.check("#cpp")
    tip = hover_peak(page)
    # the stack capture's own frames stay hidden even with C++ frames shown, as memory_viz hides them
    assert "at::native::empty_cuda()" in tip and "torch::unwind" not in tip and "stack capture" in tip
    page.select_option("#device", "0")
    wait_until(page, "window.tbmemViewer.device() === 'cuda:0'", timeout_s=120)
    assert page.evaluate("window.tbmemViewer.stats()")["peak"] == 1536
    assert requests == [] and errors == []


def test_time_axis_and_step_markers(browser, tmp_path):
    from tbmem._internal.snapshot.schema import SnapshotBuilder

    b = SnapshotBuilder(source="dispatch", device="cpu")
    for step in range(3):
        b.mark(f"step {step}", kind="step")
        b.alloc(1 << 20, category="activation", time_us=step * 1_000_000)
    page, _r, errors = _page(browser, tmp_path, b.build(kind="snapshot", step=0))
    markers = page.evaluate("window.tbmemViewer.head.snapshots[0].devices[0].markers")
    assert [m["label"] for m in markers] == ["step 0", "step 1", "step 2"]
    text = page.evaluate("""() => { const c = document.getElementById('timeline'); return c.toDataURL().length; }""")
    assert text > 1000 and errors == []
    page.select_option("#axis", "event")
    assert page.evaluate("window.tbmemViewer.stats()")["peak"] == 3 << 20


def test_the_viewer_takes_its_category_colours_from_the_one_palette():
    from tbmem._internal import palette
    from tbmem._internal.snapshot import viewer

    assert viewer.PALETTE == palette.CATEGORY_COLORS
    assert viewer.category_colours(["activation"])["activation"] == palette.CATEGORY_COLORS["activations"]
