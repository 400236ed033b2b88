"""The Memory tab's readings on a click between memory records: a run that logs its loss every step and
memory every 5 (the Quickstart's pattern) shows, on a click at step 24, the memory record of step 20, says
so, and the loss of step 24 beside it (it showed a record of step 24 with the loss alone). In headless
Chromium inside a real TensorBoard, and through the route."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.plugin import charts
from tbmem._internal.plugin.series import Series
from tests._browser import chromium, open_tab, wait_until
from tests.plugin._logdir import Server

RSS = "Memory/RAM/process_rss_GB"


@pytest.fixture(scope="module")
def quickstart_logdir(tmp_path_factory):
    """30 steps of a tiny model: ``Loss/batch`` every step, memory every 5, a census every 10; a tensor over a
    NumPy array that only the tensor holds (a blind spot the census names)."""
    import numpy as np

    logdir = tmp_path_factory.mktemp("quickstart") / "runs"
    model = torch.nn.Linear(8, 4)
    sims = {3: torch.from_numpy(np.zeros(20_000, dtype=np.float32))}  # noqa: F841 (held for the census)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryWriter(str(logdir / "exp"), every=5, census_every=10) as writer:
        writer.watch(model, optimizer)
        for step in range(30):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            writer.add_scalar("Loss/batch", loss.item(), step)
            writer.log_memory(step)
    return logdir


def _series(points: dict[str, dict[int, float]]) -> dict[str, Series]:
    from types import SimpleNamespace

    return {tag: Series.from_data([SimpleNamespace(step=s, value=v, wall_time=float(s)) for s, v in values.items()])
            for tag, values in points.items()}


def test_the_record_is_the_memory_record_at_or_before_the_step():
    series = _series({"Loss/batch": {s: 1.0 / (s + 1) for s in range(30)},
                      RSS: {s: 0.5 + s / 1000 for s in range(0, 30, 5)},
                      "Perf/step_time_ms": {s: 10.0 for s in range(30)}})
    doc = charts.record_at(series, 24)
    assert doc["step"] == 20 and doc["clicked"] == 24
    assert {r["tag"]: r["value"] for r in doc["readings"]}[RSS] == pytest.approx(0.52)
    assert [r["tag"] for r in doc["losses_at_click"]["readings"]] == ["Loss/batch"]
    assert doc["losses_at_click"]["readings"][0]["value"] == pytest.approx(1 / 25)
    on_a_record = charts.record_at(series, 25)
    assert on_a_record["step"] == 25 and "losses_at_click" not in on_a_record
    assert charts.record_at(_series({"Loss/batch": {0: 1.0, 1: 0.5}, RSS: {3: 0.5}}), 1)["step"] == 3  # the first


@pytest.fixture(scope="module")
def server(quickstart_logdir, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(quickstart_logdir), wait_run="exp")
    yield srv
    srv.stop()


def test_the_route_gives_the_memory_record_before_a_loss_only_step(server):
    with urllib.request.urlopen(f"{server.base}/data/plugin/tbmem/at?run=exp&step=24", timeout=60) as r:
        doc = json.loads(r.read())
    assert doc["record"]["step"] == 20 and doc["census"]["step"] == 20
    assert RSS in {x["tag"] for x in doc["record"]["readings"]}
    assert [x["tag"] for x in doc["record"]["losses_at_click"]["readings"]] == ["Loss/batch"]


def test_a_click_between_records_shows_the_memory_record_and_says_its_step(server):
    with chromium() as browser:
        context, tab, errors = open_tab(browser, f"{server.base}/#tbmem", width=1280, height=900,
                                        only_from=server.base)
        page = tab.page
        state = "window.tbmemMemoryTab"
        wait_until(tab, f"() => {state} && {state}.chart && {state}.overview && {state}.overview.run === 'exp'")
        # the note under the charts tells the truth about ?smoothing=0
        assert "Time Series only" in tab.inner_text("#smoothing-note")
        box = tab.locator("#census-panel .u-over").bounding_box()
        x = tab.evaluate(f"{state}.chart.census.valToPos(24, 'x')")
        page.mouse.move(box["x"] + x, box["y"] + box["height"] * 0.5)
        page.mouse.click(box["x"] + x, box["y"] + box["height"] * 0.5)
        tab.wait_for_selector("#at-box:not([hidden]) .readings-table")
        assert tab.evaluate(f"{state}.step") == 24
        assert tab.inner_text("#readings h3") == "Readings of the record at step 20 (the last one at or before step 24)"
        assert RSS in tab.inner_text(".readings-table")
        assert "Loss at step 24" in tab.inner_text("#readings") and "Loss/batch" in tab.inner_text(".click-loss-table")
        assert "census at step 20" in tab.inner_text("#at-title")
        # the blind spot's sentence says its tensors are counted: no 'Not counted:' label over it
        census = tab.inner_text("#census")
        assert "Not counted" not in census and "Blind spots and notes" in census
        assert "torch did not allocate" in tab.inner_text("#census .census-notes")
        assert errors == []
        context.close()
