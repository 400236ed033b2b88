"""The Memory tab on a planted trace whose ``tbmem`` summary has the wrong shape, in a real TensorBoard and
headless Chromium: the run's other panels (chart, snapshots, findings) and a compare view the address opens
on that run still show; the profile window is one line where it would be (issue 40, defect 10)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.logdir.traces import trace_name, trace_path
from tests._browser import open_tab, wait_until
from tests.plugin._logdir import Server, get

# one the server refuses (422: steps not a list), one it passes that the page cannot draw (no split, no tracks)
SUMMARIES = {"wrong": {"steps": 3, "operators": "x"},
             "odd": {"steps": [], "total_us": 1000, "operators": {"by_self_time": [], "by_bytes": []}}}


def _run(folder: Path) -> None:
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryWriter(folder, every=1, census_every=2) as w:
        w.watch(model, opt)
        for step in range(6):
            loss = model(torch.randn(4, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.log_memory(step)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("shapes")
    for run in ("good", *SUMMARIES):
        _run(logdir / run)
    for run, summary in SUMMARIES.items():
        path = Path(trace_path(str(logdir / run), trace_name(rank=0, step=2)))
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"traceEvents": [], "tbmem": {"rank": 0, "first_step": 2, "last_step": 4, "summary": summary}}
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    srv = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(logdir), wait_run="good")
    yield srv
    srv.stop()


def _open(browser, srv, fragment):
    return open_tab(browser, f"{srv.base}/#tbmem&{fragment}", height=1400)


def test_the_server_refuses_a_summary_of_the_wrong_shape_with_its_reason(served):
    name = trace_name(rank=0, step=2)
    status, body, _ = get(f"{served.base}/data/plugin/tbmem/profile?run=wrong&name={name}")
    assert status == 422 and "wrong shape" in json.loads(body)["error"]


@pytest.mark.parametrize("run", sorted(SUMMARIES))
def test_a_wrong_shaped_summary_leaves_the_other_panels_shown(served, browser, run):
    context, tab, errors = _open(browser, served, f"p.tbmem.run={run}")
    wait_until(tab, "() => window.tbmemMemoryTab && window.tbmemMemoryTab.run")
    assert tab.evaluate("window.tbmemMemoryTab.run") == run
    # the findings: the leak verdict is drawn (it never was: the exception stopped selectRun before it)
    wait_until(tab, "() => document.querySelector('#leaks .ok, #leaks .leak')")
    wait_until(tab, "() => window.tbmemMemoryTab.overview")
    assert tab.evaluate("document.querySelectorAll('#snapshots table, #snapshots .empty').length") == 1
    assert tab.locator(".profile-table tbody tr").count() == 1  # the window is listed
    note = tab.locator("#profile-detail .error")
    assert note.count() == 1 and trace_name(rank=0, step=2) in note.text_content()
    assert "\n" not in note.text_content().strip()
    assert errors == []
    context.close()


def test_a_compare_link_opening_on_that_run_shows_the_comparison(served, browser):
    context, tab, errors = _open(browser, served, "p.tbmem.run=odd&p.tbmem.compare=odd|good")
    view = "window.tbmemMemoryTab.compare.view"
    wait_until(tab, f"() => window.tbmemMemoryTab && window.tbmemMemoryTab.compare && {view}.doc")
    runs = tab.evaluate(f"{view}.doc.comparison.runs.map(r => r.run)")
    assert runs == ["odd", "good"] and tab.is_visible("#compare-box")
    assert tab.locator(".compare-table tbody tr").count() > 0
    assert errors == []
    context.close()
