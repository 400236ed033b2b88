"""The viewer's defects of issue 23 and what it adds, each in headless Chromium with every request blocked:
state-only snapshots, idle gaps, the peak before the first event, exact zoom, ticks and wording, the
allocator view, keyboard stepping, several snapshots and their comparison, colours from Python."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tbmem._internal.snapshot.cuda import convert_torch_snapshot
from tbmem._internal.snapshot.schema import SnapshotBuilder
from tests._browser import CHROMIUM, wait_until
from tests.snapshot._page import filled_pixels, hover_at, open_page, write_page

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("TBMEM_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (apt-get install chromium)")
MiB, GiB = 2**20, 2**30
USER = {"filename": "/home/u/train.py", "line": 42, "name": "forward"}


def _ev(action, addr, size, t=None, frames=(USER,), **kw):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), **kw}
    if t is not None:
        e["time_us"] = 1_757_000_000_000_000 + t
    return e


def _seg(addr, total, blocks=(), **kw):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": list(blocks), **kw}


def _block(addr, size, state="active_allocated", frames=(USER,)):
    return {"address": addr, "size": size, "requested_size": size if state != "inactive" else 0, "state": state,
            "frames": list(frames)}


def test_a_snapshot_without_trace_events_is_drawn(browser, tmp_path):
    # _snapshot() with history off, vLLM/verl, OOM handlers: the page threw in aliveAt/renderPeak
    blocks = [_block(0x1000 + i * 2 * MiB, 2 * MiB) for i in range(5)]
    snap = convert_torch_snapshot({"segments": [_seg(0x1000, 20 * MiB, blocks + [
        _block(0x1000 + 10 * MiB, 10 * MiB, "inactive", ())])]}, kind="snapshot", step=0)
    page, requests, errors = open_page(browser, write_page(tmp_path, snap))
    assert filled_pixels(page) > 5000  # flat over an event axis of length 0
    assert page.locator("#peak tbody tr").count() == 5
    assert page.evaluate("window.tbmemViewer.allocator()")["byCategory"] == {"python code": 10 * MiB}
    assert "inactive split 10.00 MiB" in page.inner_text("#explain")
    assert requests == [] and errors == []


def test_an_idle_gap_shows_what_stayed_alive_not_the_spike_before_it(browser, tmp_path):
    # bcrafton: 2.866 GiB alive from 37.7 ms to 50.6 ms was drawn as the 3.58 GiB spike before it
    trace = [_ev("alloc", 0x1000, GiB, 0), _ev("alloc", 0x50000000, 2 * GiB, 1000),
             _ev("free_requested", 0x50000000, 2 * GiB, 2000), _ev("free_completed", 0x50000000, 2 * GiB, 2000),
             _ev("alloc", 0x90000000, MiB, 100_000)]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    cols = page.evaluate("window.tbmemViewer.columns()")
    n = len(cols["top"])
    gap = cols["top"][n // 10: n * 9 // 10]
    assert set(gap) == {GiB} and max(cols["top"]) == 3 * GiB
    box = page.locator("#timeline").bounding_box()
    tip = hover_at(page, box["width"] / 2, box["height"] - 60)
    assert "1.00 GiB active" in tip and "event 3" in tip
    # the overview drawn before the columns are decoded carries the same state
    bands = page.evaluate("window.tbmemViewer.head.snapshots[0].devices[0].overview.bands")
    totals = np.array(bands).sum(axis=0)
    assert set(totals[300:1800].tolist()) == {GiB}
    assert errors == []


def test_zoom_is_exact_at_every_range_and_loses_no_peak(browser, tmp_path):
    rng = np.random.default_rng(5)
    b = SnapshotBuilder(source="cuda", device="cuda:0")
    live, t = [], 0
    for _ in range(4000):
        t += int(rng.integers(1, 50))
        if live and rng.random() < 0.45:
            b.free(live.pop(int(rng.integers(len(live)))), time_us=t)
        else:
            live.append(b.alloc(int(rng.integers(1, 5000)) * 512, category=["python code", "backward"][int(rng.integers(2))],
                                time_us=t, stack=[("/u/a.py", 1, "f")]))
    snap = b.build(kind="snapshot", step=0)
    dev = snap.main
    tl, tm = dev.timeline(), np.maximum.accumulate(dev.time_us)
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    full = page.evaluate("window.tbmemViewer.view()")["full"]
    for frac in ((0.0, 1.0), (0.3, 0.31), (0.5, 0.5004), (0.9, 0.97)):
        x0 = full["x0"] + frac[0] * (full["x1"] - full["x0"])
        x1 = full["x0"] + frac[1] * (full["x1"] - full["x0"])
        page.evaluate(f"window.tbmemViewer.setView({x0}, {x1})")
        v = page.evaluate("window.tbmemViewer.view()")
        cols = page.evaluate("window.tbmemViewer.columns()")
        w = len(cols["top"])
        # numpy: each column's events and the state carried in
        k = np.floor((tm - v["x0"]) / (v["x1"] - v["x0"]) * w).astype(int)
        for c in range(w):
            mine = np.flatnonzero(k == c)
            before = np.flatnonzero(tm < v["x0"] + c * (v["x1"] - v["x0"]) / w)
            carried = tl[before[-1]] if before.shape[0] else dev.baseline_bytes()
            values = np.concatenate(([carried], tl[mine]))
            assert (cols["top"][c], cols["bot"][c]) == (values.max(), values.min()), (frac, c)
    page.evaluate("window.tbmemViewer.setView(-1e18, 1e18)")
    assert max(page.evaluate("window.tbmemViewer.columns()")["top"]) == dev.peak_bytes()
    assert errors == []


def test_brush_wheel_and_double_click(browser, tmp_path):
    b = SnapshotBuilder(source="cuda", device="cuda:0")
    for i in range(200):
        b.alloc(1024 * (i + 1), category="python code", time_us=i * 10)
    page, _r, errors = open_page(browser, write_page(tmp_path, b.build(kind="snapshot", step=0)))
    box = page.locator("#timeline").bounding_box()
    full = page.evaluate("window.tbmemViewer.view()")
    page.mouse.move(box["x"] + 300, box["y"] + 100)
    page.mouse.down()
    page.mouse.move(box["x"] + 500, box["y"] + 100, steps=5)
    page.mouse.up()
    brushed = page.evaluate("window.tbmemViewer.view()")
    assert full["full"]["x0"] < brushed["x0"] < brushed["x1"] < full["full"]["x1"]
    page.mouse.move(box["x"] + 400, box["y"] + 100)
    page.mouse.wheel(0, -300)
    zoomed = page.evaluate("window.tbmemViewer.view()")
    assert zoomed["x1"] - zoomed["x0"] < brushed["x1"] - brushed["x0"]
    page.mouse.dblclick(box["x"] + 400, box["y"] + 100)
    assert page.evaluate("window.tbmemViewer.view()")["x0"] == full["full"]["x0"]
    assert errors == []


def test_keyboard_steps_the_allocator_view_event_by_event(browser, tmp_path):
    trace = [_ev("segment_alloc", 0x1000, 20 * MiB, 0, ())] + [_ev("alloc", 0x1000 + i * MiB, MiB, 1 + i) for i in range(10)]
    snap = convert_torch_snapshot({"segments": [_seg(0x1000, 20 * MiB, [_block(0x1000 + i * MiB, MiB) for i in range(10)]
                                                     + [_block(0x1000 + 10 * MiB, 10 * MiB, "inactive", ())])],
                                   "device_traces": [trace]}, kind="snapshot", step=0)
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    assert page.evaluate("window.tbmemViewer.selected()") == 10  # opened at the peak
    page.keyboard.press("Home")
    assert page.evaluate("window.tbmemViewer.selected()") == -1
    assert page.evaluate("window.tbmemViewer.allocator()")["reserved"] == 0  # nothing reserved before the trace
    for expected in range(0, 4):
        page.keyboard.press("ArrowRight")
        st = page.evaluate("window.tbmemViewer.allocator()")
        assert st["event"] == expected and st["reserved"] == 20 * MiB and st["byCategory"].get("python code", 0) == expected * MiB
    assert "after event 3" in page.inner_text("#alloctitle")
    assert errors == []


def test_allocator_view_matches_python_at_every_event(browser, tmp_path):
    from tbmem._internal.snapshot.allocator import allocator_state

    trace = [_ev("segment_alloc", 0x100000, 20 * MiB, 0, ()), _ev("alloc", 0x100000, 3 * MiB - 100, 1),
             _ev("alloc", 0x100000 + 3 * MiB, MiB, 2), _ev("free_requested", 0x100000, 3 * MiB - 100, 3),
             _ev("segment_alloc", 0x9000000, 2 * MiB, 4, (), stream=99), _ev("alloc", 0x9000000, 512, 5),
             _ev("free_completed", 0x100000, 3 * MiB - 100, 6), _ev("free_requested", 0x9000000, 512, 7),
             _ev("free_completed", 0x9000000, 512, 8), _ev("segment_free", 0x9000000, 2 * MiB, 9, ())]
    final = [_seg(0x100000, 20 * MiB, [_block(0x100000, 3 * MiB, "inactive", ()), _block(0x100000 + 3 * MiB, MiB),
                                       _block(0x100000 + 4 * MiB, 16 * MiB, "inactive", ())])]
    snap = convert_torch_snapshot({"segments": final, "device_traces": [trace]}, kind="snapshot", step=0)
    dev = snap.main
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    for ev in range(-1, dev.n_events):
        page.evaluate(f"window.tbmemViewer.select({ev})")
        js = page.evaluate("window.tbmemViewer.allocator()")
        py = allocator_state(dev, ev, snap.categories)
        assert (js["reserved"], js["pending"], js["rounding"], js["split"], js["external"], js["byCategory"]) == \
            (py.reserved, py.pending_free, py.rounding, py.inactive_split, py.free_segments, py.by_category), ev
    page.evaluate("window.tbmemViewer.select(3)")
    assert page.evaluate("window.tbmemViewer.allocator()")["pending"] == 3 * MiB - 100
    page.evaluate("window.tbmemViewer.select(5)")
    assert "(0x63)" in page.inner_text("#segtable")  # the segment of stream 99 is named by its stream
    assert errors == []


def test_ticks_axis_choice_and_wording_on_tiny_traces(browser, tmp_path):
    for n in (0, 1, 2):
        trace = [_ev("alloc", 0x1000 + i * 4096, 1024) for i in range(n)]  # no time_us
        snap = convert_torch_snapshot({"segments": [_seg(0x1000, 2 * MiB)], "device_traces": [trace]},
                                      kind="snapshot", step=0)
        page, _r, errors = open_page(browser, write_page(tmp_path, snap, f"tiny{n}.html"))
        ticks = page.evaluate("window.tbmemViewer.xTicks()")
        assert all(re.fullmatch(r"\d+", t) for t in ticks), ticks  # never 0.30000000000000004
        assert page.evaluate("document.querySelector('#axis option[value=time]').disabled")
        assert "at before" not in page.inner_text("body")
        assert errors == []
        page.close()


def test_time_ticks_use_one_unit(browser, tmp_path):
    b = SnapshotBuilder(source="cuda", device="cuda:0")
    for i in range(50):
        b.alloc(4096, category="python code", time_us=i * 1000)  # 49 ms
    page, _r, errors = open_page(browser, write_page(tmp_path, b.build(kind="snapshot", step=0)))
    ticks = page.evaluate("window.tbmemViewer.xTicks()")
    assert ticks[0] == "0 ms" and len({t.split()[1] for t in ticks}) == 1, ticks  # not "0 us" beside "5.000 ms"
    assert errors == []


def test_no_empty_stack_header_and_no_device_for_an_empty_snapshot(browser, tmp_path):
    cpp_only = [{"filename": "??", "line": 0, "name": "at::native::empty_cuda()"}]
    trace = [_ev("alloc", 0x1000, MiB, None, cpp_only)]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    page.locator("#peak tbody tr").first.click()
    text = page.inner_text("#details")
    assert "stack at the allocation:" not in text and "C++ frames hidden" in text
    empty = convert_torch_snapshot({"segments": [], "device_traces": []}, kind="snapshot", step=0)
    page2, _r2, errors2 = open_page(browser, write_page(tmp_path, empty, "empty.html"))
    assert "no memory" in page2.inner_text("#summary") and "cuda:0" not in page2.inner_text("body")
    assert errors == [] and errors2 == []


def test_legend_is_never_clipped(browser, tmp_path):
    b = SnapshotBuilder(source="dispatch", device="cpu")
    for i, cat in enumerate(("activation", "optimizer_state", "parameter", "gradient", "backward", "no_grad")):
        b.alloc(4096 * (i + 1), category=cat, time_us=i)
    page, _r, errors = open_page(browser, write_page(tmp_path, b.build(kind="snapshot", step=0)), width=420)
    labels = page.evaluate("""() => Array.from(document.querySelectorAll('#categories label')).map(l => {
        const r = l.getBoundingClientRect();
        return [l.textContent, l.scrollWidth <= l.clientWidth + 1, r.right <= document.documentElement.clientWidth];
    })""")
    assert [t for t, _a, _b in labels] == ["activation", "optimizer_state", "parameter", "gradient", "backward", "no_grad"]
    assert all(fits and inside for _t, fits, inside in labels)
    assert errors == []


def test_colours_come_from_python(browser, tmp_path):
    from tbmem._internal.snapshot import viewer

    b = SnapshotBuilder(source="dispatch", device="cpu")
    b.alloc(4096, category="optimizer_state", time_us=0)
    b.alloc(4096, category="parameter", time_us=1)
    page, _r, errors = open_page(browser, write_page(tmp_path, b.build(kind="snapshot", step=0)))
    swatches = page.evaluate("""() => Array.from(document.querySelectorAll('#categories .swatch')).map(s => s.style.background)""")
    assert swatches == ["rgb(225, 87, 89)", "rgb(78, 121, 167)"]  # the Memory tab's optimizer_state and parameters
    js = ""
    for name in viewer.JS_FILES:
        with open(os.path.join(os.path.dirname(viewer.__file__), name), encoding="utf-8") as fh:
            js += fh.read()
    assert not any(c in js.lower() for c in viewer.PALETTE.values())
    assert errors == []


def test_several_snapshots_and_their_comparison_match_tbmem_snapshot_diff(browser, tmp_path):
    from tbmem._internal.snapshot.diff import diff_doc

    def snap(step, n):
        b = SnapshotBuilder(source="cuda", device="cuda:0")
        b.alloc(8 * MiB, category="parameter", stack=[("/u/model.py", 3, "init")], time_us=0, addr=0x1000)
        for i in range(n):
            b.alloc(MiB, category="activation", stack=[("/u/train.py", 9, "step")], time_us=1 + i, addr=0x100000 * (i + 10))
        return b.build(kind="snapshot", step=step)

    a, c = snap(100, 2), snap(200, 5)
    page, _r, errors = open_page(browser, write_page(tmp_path, [a, c], names=["step100", "step200"]))
    assert page.locator("#snapshot option").all_inner_texts() == ["step100", "step200"]
    page.select_option("#snapshot", "1")
    wait_until(page, "window.tbmemViewer.snapshot() === 1 && window.tbmemViewer.diff() !== null")
    js = page.evaluate("window.tbmemViewer.diff()")
    py = diff_doc(a, c)["devices"][0]
    keys = ("label", "category", "a_bytes", "b_bytes", "delta_bytes", "new_bytes", "new_count")
    assert [tuple(r[k] for k in keys) for r in js["grew"]] == [tuple(r[k] for k in keys) for r in py["grew"]]
    assert js["grew"][0]["label"] == "step (/u/train.py:9)" and js["grew"][0]["delta_bytes"] == 3 * MiB
    assert "+3.00 MiB" in page.inner_text("#difftable")
    assert errors == []
