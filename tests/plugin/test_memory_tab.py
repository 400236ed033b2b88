"""The Memory tab on the demo's logdir (what ``make demo`` writes), in headless Chromium inside a real
TensorBoard: the run it opens on, the census and RSS in panels of their own, whole-step ticks, mark
labels that never overlap, the choice kept in the address; and the process tree's RSS line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tbmem._internal.plugin import charts
from tbmem._internal.plugin.series import Series
from tbmem._internal.tags import TAGS
from tests._browser import frame, wait_until
from tests.plugin._logdir import Server

RSS, TREE = TAGS["ram_rss"].tag, TAGS["ram_tree_rss"].tag


def _series(values: dict[int, float]) -> Series:
    return Series.from_data([SimpleNamespace(step=s, value=v, wall_time=float(s)) for s, v in values.items()])


@pytest.mark.parametrize("tree, drawn", [({0: 0.40, 1: 0.40, 2: 0.401}, False),  # no workers: the same line
                                         ({0: 0.40, 1: 0.95, 2: 0.96}, True)])     # DataLoader workers
def test_the_process_tree_is_a_line_when_it_differs_from_the_process(tree, drawn):
    series = {RSS: _series({0: 0.40, 1: 0.40, 2: 0.40}), TREE: _series(tree)}
    doc = charts.overview(series, breakdown="category", points=100, all_tags=list(series))
    labels = [line["label"] for line in doc["lines"]["host"]]
    assert labels[0] == "RSS" and (TREE in [line["tag"] for line in doc["lines"]["host"]]) is drawn
    if drawn:
        assert doc["columns"][TREE][1] == pytest.approx(0.95 * 2**30)


@pytest.fixture(scope="module")
def demo_server(demo_logdir, tmp_path_factory):
    runs = sorted(str(p.parent.relative_to(demo_logdir)) for p in demo_logdir.rglob("events.out.tfevents*"))
    srv = Server(tmp_path_factory.mktemp("tb-demo"), "--logdir", str(demo_logdir), wait_run=runs[-1])
    yield srv, runs
    srv.stop()


def _open(browser, base, hash_="#tbmem"):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    foreign = []
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else (foreign.append(r.request.url), r.abort()))
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/{hash_}")
    tab = frame(page, "plugin_entry.html")
    wait_until(tab, "() => window.tbmemMemoryTab && window.tbmemMemoryTab.chart && window.tbmemMemoryTab.overview"
                    " && window.tbmemMemoryTab.overview.run === window.tbmemMemoryTab.run")
    return context, page, tab, foreign, errors


def _disjoint(a, b) -> bool:
    return a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"] or b["bottom"] <= a["top"]


def test_the_tab_on_the_demo_logdir(demo_server, browser, tmp_path):
    srv, runs = demo_server
    context, page, tab, foreign, errors = _open(browser, srv.base)
    state = "window.tbmemMemoryTab"
    # opens on the most recent run with a census (not the first by name: the PhiFlow run, which has none)
    assert runs[0].startswith("burgers_physical_quick_test")
    shown = tab.evaluate(f"{state}.run")
    assert shown.startswith("burgers_quick_test/") and tab.evaluate(f"{state}.overview.census_steps.length") >= 5
    page.screenshot(path=str(tmp_path / "first.png"))
    # the census and the RSS lines in panels of their own, RSS under the census
    census, lines = tab.locator("#census-panel").bounding_box(), tab.locator("#lines-panel").bounding_box()
    assert lines["y"] >= census["y"] + census["height"]
    assert tab.evaluate(f"{state}.chart.census.series.slice(1).map(s => s.label)") == [
        "parameters", "gradients", "optimizer_state", "buffers", "activations", "other"]
    assert tab.evaluate(f"{state}.chart.lines.series.slice(1).map(s => s.label)") == ["RSS", "peak RSS"]
    # whole steps on both x axes
    ticks = tab.evaluate(f"{state}.chart.xTicks")
    assert set(ticks) == {"census", "lines", "loss"} and all(len(t) >= 3 for t in ticks.values())
    assert all(float(t).is_integer() for t in ticks["census"] + ticks["lines"])
    # the snapshot labels: one per snapshot step, above the plot (never over a line), none overlapping
    labels = tab.evaluate(f"{state}.chart.labels")
    placed, plot = labels["placed"], labels["plot"]
    assert sorted(b["step"] for b in placed) == sorted(m["step"] for m in tab.evaluate(f"{state}.overview.marks"))
    assert labels["hidden"] == 0
    for i, a in enumerate(placed):
        assert a["bottom"] <= plot["top"] and a["left"] >= plot["left"] and a["right"] <= plot["right"] + 0.5
        assert all(_disjoint(a, b) for b in placed[i + 1:]), (a, placed)
    # crowded marks (one every 5 px): still no overlap; what does not fit is left out, and counted
    crowded = tab.evaluate("""async () => {
        const m = await import('./chart.js');
        return m.placeLabels(Array.from({length: 40}, (_, i) => ({px: 100 + 5 * i, text: 'snapshot', step: i})),
                             (t) => 6 * t.length, 80, 1200); }""")
    boxes = crowded["placed"]
    assert crowded["hidden"] > 0 and len(boxes) + crowded["hidden"] == 40
    assert all(a["row"] != b["row"] or a["right"] <= b["left"] or b["right"] <= a["left"]
               for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # a clicked step: the census and the readings there
    box = tab.locator("#census-panel .u-over").bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)
    tab.wait_for_selector("#at-box:not([hidden]) .census-table")
    assert "Memory/RAM/process_rss_GB" in tab.inner_text(".readings-table")
    page.screenshot(path=str(tmp_path / "step.png"))
    # an opened snapshot, drawn by the viewer inside the tab
    tab.locator("#snapshots button.open").last.click()
    viewer = frame(page, "/data/plugin/tbmem/snapshot?")
    wait_until(viewer, "() => window.tbmemViewer !== undefined && window.tbmemViewer.exact", timeout_s=60)
    tab.locator("#viewer").scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "snapshot.png"))
    # the choice is kept in TensorBoard's address: choosing the other run, then reloading, shows it again
    other = next(r for r in runs if not r.startswith("burgers_quick_test/"))
    tab.select_option("#run", other.split("/")[0] if "/" not in other else other)
    wait_until(tab, f"() => {state}.overview && {state}.overview.run === {other!r}")
    assert "p.tbmem.run=" in page.evaluate("location.hash")
    page.reload()
    tab = frame(page, "plugin_entry.html")
    wait_until(tab, f"() => window.tbmemMemoryTab && window.tbmemMemoryTab.overview"
                    f" && window.tbmemMemoryTab.overview.run === {other!r}")
    # a run without a census: the lines panel alone, and a line saying why
    assert tab.evaluate(f"{state}.chart.census") is None and "No census" in tab.inner_text("#chart")
    assert errors == [] and foreign == []
    context.close()
