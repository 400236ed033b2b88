"""The Memory tab in headless Chromium inside a real TensorBoard, with every non-local request blocked."""

from __future__ import annotations

import json

import pytest

from tests._browser import frame, wait_until


def _coloured_pixels(frame, selector: str) -> int:
    return frame.evaluate("""(sel) => {
        let n = 0;
        for (const c of document.querySelectorAll(sel)) {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let i = 0; i < d.length; i += 4) {
                const [r, g, b, a] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
                if (a > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 40) n++;  // not white/grey/black
            }
        }
        return n;
    }""", selector)


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    foreign, errors, local = [], [], []

    def route(r):
        url = r.request.url
        if url.startswith(server.base + "/") or url == server.base:
            local.append(url)
            r.continue_()
        else:
            foreign.append(url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server.base}/#tbmem")
    yield page, foreign, errors, local
    context.close()


def test_memory_tab_draws_clicks_and_opens_a_snapshot(page, tmp_path, logdir_paths):
    page, foreign, errors, local = page
    tab = frame(page, "plugin_entry.html")
    tab.wait_for_selector("#chart canvas", timeout=60_000)
    tab.select_option("#run", "train")
    wait_until(tab, "() => window.tbmemMemoryTab && window.tbmemMemoryTab.run === 'train'"
                          " && window.tbmemMemoryTab.overview && window.tbmemMemoryTab.overview.run === 'train'")
    tab.wait_for_selector("#snapshots button.open")
    # the stacked census is drawn: six category bands, coloured pixels on its canvas; RSS in a panel under it
    assert tab.evaluate("window.tbmemMemoryTab.chart.census.series.length") == 1 + 6
    assert tab.evaluate("window.tbmemMemoryTab.chart.lines.series.map(s => s.label)") == ["step", "RSS", "peak RSS"]
    assert _coloured_pixels(tab, "#census-panel canvas") > 5000
    # a click on the chart shows the census at that step and the record's readings
    box = tab.locator("#census-panel .u-over").bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.6)
    tab.wait_for_selector("#at-box:not([hidden]) .census-table")
    rows = tab.locator(".census-table tbody tr").all_inner_texts()
    assert [r.split("\t")[0] for r in rows][:6] == ["parameters", "gradients", "optimizer_state", "buffers",
                                                    "activations", "other"]
    top = tab.locator(".top-table tbody tr").all_inner_texts()
    assert len(top) == 5 and "0.weight" in top[0] and "256×64" in top[0] and "float32" in top[0]
    assert "Memory/RAM/process_rss_GB" in tab.inner_text(".readings-table")
    page.screenshot(path=str(tmp_path / "memory-tab.png"))
    # open the PyTorch pickle: the offline viewer draws it inside the tab
    row = tab.locator("#snapshots tr", has_text="rank0_memory_snapshot.pickle")
    row.locator("button.open").click()
    tab.wait_for_selector("#viewer-box:not([hidden])")
    viewer = frame(page, "/data/plugin/tbmem/snapshot?")
    wait_until(viewer, "window.tbmemViewer !== undefined && window.tbmemViewer.exact", timeout_s=60)
    # the peak computed from the pickle's events when it was written (tests/_torch_snapshot.py)
    peak = json.loads(logdir_paths["facts"].read_text())["real_peak_bytes"]
    assert viewer.evaluate("window.tbmemViewer.stats().peak") == peak
    assert _coloured_pixels(viewer, "#timeline") > 5000
    tab.locator("#viewer").scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "memory-tab-snapshot.png"))
    # findings and the run summary arrive after the first view
    tab.wait_for_selector("#summary pre")
    assert "No leak found" in tab.inner_text("#leaks")
    assert errors == [] and foreign == []
    assert any("/data/plugin/tbmem/overview" in u for u in local)


def test_rank_selector_and_peak_comparison(page):
    page, foreign, errors, _ = page
    tab = frame(page, "plugin_entry.html")
    tab.wait_for_selector("#chart canvas", timeout=60_000)
    tab.select_option("#run", "exp")
    tab.wait_for_selector("#ranks-box:not([hidden]) .ranks-table")
    assert tab.locator("#rank option").all_inner_texts() == ["rank 0", "rank 1"]
    wait_until(tab, "() => window.tbmemMemoryTab.overview && window.tbmemMemoryTab.overview.run === 'exp/rank0'")
    tab.select_option("#rank", "exp/rank1")
    wait_until(tab, "() => window.tbmemMemoryTab.overview.run === 'exp/rank1'")
    rows = tab.locator(".ranks-table tbody tr").all_inner_texts()
    assert rows[0].startswith("rank 0") and "1.00 MiB" in rows[0] and "2.00 MiB" in rows[1]
    assert errors == [] and foreign == []
