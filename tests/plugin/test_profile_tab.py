"""The Memory tab's profile windows, in a real TensorBoard and headless Chromium, offline: the listed
window's summary is drawn, its top operators are torch.profiler's key_averages() of the same window, its
trace downloads as written; names that are not a listed window are refused."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.logdir.traces import list_traces, trace_path
from tests._browser import frame, wait_until
from tests.plugin._logdir import Server, get, get_json


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A run with one profile window (steps 6-8), and the key_averages() of that window."""
    logdir = tmp_path_factory.mktemp("profiled")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with MemoryWriter(logdir / "prof", every=2, census_every=4,
                      profile={"every": 6, "steps": 3, "start": 6, "max_windows": 1}) as w:
        w.watch(model, opt)
        for step in range(12):
            loss = model(torch.randn(64, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.add_scalar("Loss/train", loss.item(), step)
            w.log_memory(step)
        averages = list(w._profile.last_profiler.key_averages())
    srv = Server(tmp_path_factory.mktemp("tb-prof"), "--logdir", str(logdir), wait_run="prof")
    yield srv, logdir / "prof", averages
    srv.stop()


def test_routes_list_summarise_and_serve_the_window(profiled):
    srv, run, averages = profiled
    base = f"{srv.base}/data/plugin/tbmem"
    (window,) = get_json(f"{base}/profiles?run=prof")
    assert window == list_traces(str(run))[0] and window["step"] == 6
    doc = get_json(f"{base}/profile?run=prof&name={window['name']}")
    assert [s["step"] for s in doc["summary"]["steps"]] == [6, 7, 8]
    top = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:10]
    assert [r["name"] for r in doc["summary"]["operators"]["by_self_time"]] == [a.key for a in top]
    status, body, headers = get(f"{base}/profile_trace?run=prof&name={window['name']}")
    with open(trace_path(str(run), window["name"]), "rb") as fh:
        assert status == 200 and body == fh.read()  # the file as written
    assert window["name"] in headers["Content-Disposition"]
    assert json.loads(gzip.decompress(body))["tbmem"]["first_step"] == 6
    for bad in ("../prof/events", "trace_rank0_step000000007.pt.trace.json.gz", ""):
        status, body, _ = get(f"{base}/profile?run=prof&name={bad}")
        assert status == 404, (bad, status)
        assert get(f"{base}/profile_trace?run=prof&name={bad}")[0] == 404


def _ms(us: float) -> str:  # profiles.js's format
    return f"{us / 1000:.{0 if us >= 100000 else 2}f}"


def test_the_tab_draws_the_summary_offline(profiled, browser, tmp_path):
    srv, run, averages = profiled
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    foreign, errors = [], []

    def route(r):
        if r.request.url.startswith(srv.base + "/"):
            r.continue_()
        else:
            foreign.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{srv.base}/#tbmem&p.tbmem.run=prof")
    tab = frame(page, "plugin_entry.html")
    wait_until(tab, "() => window.tbmemMemoryTab && window.tbmemMemoryTab.profiles"
                    " && window.tbmemMemoryTab.profiles.shown")
    tab.wait_for_selector(".ops-time tbody tr")
    rows = tab.evaluate("[...document.querySelectorAll('.ops-time tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
    top = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:10]
    assert [r[0] for r in rows] == [a.key for a in top]
    assert [r[1] for r in rows] == [str(a.count) for a in top]
    assert [r[2] for r in rows] == [_ms(a.self_cpu_time_total) for a in top]
    by_bytes = tab.evaluate("[...document.querySelectorAll('.ops-bytes tbody tr')].map(r => r.cells[0].textContent)")
    mem = sorted((a for a in averages if a.self_cpu_memory_usage > 0), key=lambda a: (-a.self_cpu_memory_usage, a.key))
    assert by_bytes == [a.key for a in mem[:10]] and by_bytes
    split = tab.evaluate("[...document.querySelectorAll('.split-table tbody tr')].map(r => r.cells[0].textContent)")
    assert split == ["forward", "backward", "optimizer", "data loading", "other"]
    assert tab.evaluate("document.querySelectorAll('#profile-tracks svg polyline').length") >= 2  # RSS, categories
    # every reading in the tracks' legends and axes as a short number (a category of kilobytes in GB
    # read 0.000003815)
    labels = tab.evaluate("[...document.querySelectorAll('#profile-tracks .track-legend span, #profile-tracks svg text')]"
                          ".map(n => n.textContent)")
    numbers = [w for text in labels for w in text.split() if w[:1].isdigit() or w[:1] == "-"]
    assert numbers and all(len(w) <= 9 and "0.000" not in w for w in numbers), numbers
    assert "Steps 6–8, rank 0" in tab.locator("#profile-title").text_content()
    href = tab.get_attribute("#profile-download", "href")
    assert href.startswith("profile_trace?") and tab.locator("#profile-perfetto").is_visible()
    tab.locator("#profile-box").scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "profile.png"), full_page=True)
    assert foreign == [] and errors == []  # offline: nothing but TensorBoard was asked
    context.close()
