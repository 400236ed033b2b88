"""The Memory tab's compare view on the issue's acceptance runs (tests/_compare_runs.py), in a real TensorBoard:
the route serves `tbmem compare`'s own numbers for the runs TensorBoard holds, and the view, in headless
Chromium, shows them in the order chosen (A first), the runs' memory on one axis in the runs' colours, the
census bars in the categories' colours (tbmem._internal.palette)."""

from __future__ import annotations

import json

import pytest

from tbmem._internal import palette
from tbmem._internal.cli import main
from tests._browser import open_tab, wait_until
from tests._events import scalars
from tests.plugin._logdir import Server, get, get_json

ORDER = ["heat", "burgers", "unet_f8", "unet_f16"]


@pytest.fixture(scope="module")
def compare_server(compare_logdir, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("tb-compare"), "--logdir", str(compare_logdir), wait_run="unet_f16")
    yield srv
    srv.stop()


def _url(srv, runs, **extra):
    query = "&".join([f"run={r}" for r in runs] + [f"{k}={v}" for k, v in extra.items()])
    return f"{srv.base}/data/plugin/tbmem/compare?{query}"


def test_the_route_serves_the_command_lines_numbers(compare_server, compare_logdir, capsys):
    doc = get_json(_url(compare_server, ORDER))
    assert main(["compare", *[str(compare_logdir / r) for r in ORDER], "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert doc["comparison"]["rows"] == cli["rows"] and doc["comparison"]["align"] == cli["align"] == "phase"
    assert [r["run"] for r in doc["comparison"]["runs"]] == ORDER
    lines = doc["lines"]
    assert lines["tag"] == "Memory/RAM/process_rss_GB" and sorted(lines["runs"]) == sorted(ORDER)
    for run in ORDER:  # each run from 0% to 100% of its records
        xs = lines["runs"][run]["x"]
        assert xs[0] == 0.0 and xs[-1] == 100.0
    peak = next(r for r in cli["rows"] if r["metric"] == "peak RAM RSS")
    for run, value in zip(ORDER, peak["values"]):
        assert max(lines["runs"][run]["y"]) <= value * 2**30  # RSS under its peak (the window's peak RSS)


@pytest.mark.parametrize("runs, extra", [(["heat"], {}), (["heat", "nope"], {}), (["heat", "heat"], {}),
                                         (["heat", "burgers"], {"align": "sideways"})])
def test_bad_requests_are_refused(compare_server, runs, extra):
    assert get(_url(compare_server, runs, **extra))[0] == 400


def test_the_view_shows_the_runs_side_by_side(compare_server, compare_logdir, browser, tmp_path):
    context, tab, errors = open_tab(browser, f"{compare_server.base}/#tbmem&p.tbmem.compare={'|'.join(ORDER)}",
                                    width=1280, height=1400)
    view = "window.tbmemMemoryTab.compare.view"
    wait_until(tab, f"() => window.tbmemMemoryTab && window.tbmemMemoryTab.compare && {view}.doc")
    doc = tab.evaluate(f"{view}.doc")
    assert [r["run"] for r in doc["comparison"]["runs"]] == ORDER  # the address's order, not the listing's
    assert tab.is_hidden("#chart-box") and tab.is_visible("#compare-box")
    # one line per run, in the runs' colours
    strokes = tab.evaluate(f"{view}.chart.series.slice(1).map(s => s.stroke())")
    assert strokes == list(palette.RUNS[:4])
    # the table: a row per metric, each cell the route's value formatted by its kind
    rows = tab.evaluate("""() => [...document.querySelectorAll('.compare-table tbody tr')].map(
        tr => [...tr.children].map(td => td.textContent))""")
    data_rows = [r for r in rows if any(c for c in r[1:])]
    expected = tab.evaluate(f"""async () => {{
        const m = await import('./compare.js');
        return {view}.doc.comparison.rows.map(r => [r.metric, ...r.values.map(v => m.fmtCell(v, r.kind)),
                                                     ...r.diffs.map(d => m.fmtDiff(d, r.kind))]); }}""")
    assert data_rows == expected
    table = {r[0]: r[1:] for r in data_rows}
    iterations = [len(scalars(compare_logdir / r, "Loss/iteration")) for r in ORDER[:2]]
    assert table["iterations"] == [str(iterations[0]), str(iterations[1]), "n/a", "n/a",
                                   f"{iterations[1] - iterations[0]:+d}".replace("+0", "±0"), "", ""]
    # census bars: A and B have none; C and D stacked in the categories' colours
    segments = tab.evaluate("""() => [...document.querySelectorAll('#compare-bars .stackbar .seg')].map(
        s => [s.dataset.category, getComputedStyle(s).backgroundColor])""")
    assert segments and {c for c, _ in segments} >= {"parameters", "gradients", "optimizer_state"}
    for category, color in segments:
        hex_ = palette.CATEGORY_COLORS[category]
        assert color == f"rgb({int(hex_[1:3], 16)}, {int(hex_[3:5], 16)}, {int(hex_[5:7], 16)})"
    assert tab.inner_text("#compare-bars").count("no census") == 6  # A and B at three points
    tab.page.screenshot(path=str(tmp_path / "compare.png"))
    # back to one run: the one-run view as it was
    tab.click("#compare-toggle")
    wait_until(tab, "() => !document.getElementById('chart-box').hidden")
    assert tab.is_hidden("#compare-box") and "p.tbmem.compare" not in tab.page.evaluate("location.hash")
    assert errors == []
    context.close()
