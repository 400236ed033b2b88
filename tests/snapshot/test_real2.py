"""Every real snapshot of ../shared/snapshots/real and real2: ``stats --json`` against each fact of real2's
README, and each one's viewer page in headless Chromium with every request blocked: no console error,
the timeline drawn, the allocator view drawn at the peak (the same numbers as Python's), a hover answered."""

from __future__ import annotations

import json
import os

import pytest

from tbmem._internal.cli import main
from tests.snapshot._page import filled_pixels, hover_peak, open_page
from tests.snapshot._real import ALL, REAL2, REAL2_FACTS, path_of, require


def _stats(path, capsys, *extra):
    assert main(["snapshot", "stats", path, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(REAL2_FACTS))
def test_readme_facts_to_the_byte(name, capsys):
    reserved, before, peak, events, largest = REAL2_FACTS[name]
    (dev,) = _stats(os.path.join(require(REAL2), name), capsys, "--top", "400")["devices"]
    assert (dev["reserved_bytes"], dev["baseline_bytes"], dev["peak_bytes"], dev["trace_events"]) == \
        (reserved, before, peak, events)
    # the explain line adds up to the reserved bytes exactly
    x = dev["explain"]
    assert x["reserved_bytes"] == reserved == sum(x["allocated_by_category"].values()) + x["pending_free_bytes"] \
        + x["rounding_bytes"] + x["inactive_split_bytes"] + x["free_segment_bytes"]
    assert x["outside_segments_bytes"] == 0
    if largest is None:
        assert all(t["frame"] is None for t in dev["top_allocations"])
        return
    size, fn, path, line = largest
    sites = [(t["frame"]["name"], t["frame"]["filename"].replace("\\", "/"), t["frame"]["line"])
             for t in dev["top_allocations"] if t["frame"] and abs(t["bytes"] - size) < 0.01 * size]
    assert any(f == fn and p.endswith(path) and ln == line for f, p, ln in sites), sites


def test_verl_pending_frees_are_counted_once_as_pending(capsys):
    # README: PyTorch's own Active Memory Timeline leaves out 596,836,352 bytes of pending frees
    (dev,) = _stats(os.path.join(require(REAL2), "verl_mem.pickle"), capsys)["devices"]
    assert dev["explain"]["pending_free_bytes"] == 596_836_352
    assert dev["requested_bytes"] == 25_483_614_352  # the README's "alive before the trace"
    # torch.cuda.memory_allocated() at the capture: the active_allocated blocks' sizes, pending frees out
    # (summed from the pickle's blocks by hand: 24,916,034,560)
    assert dev["allocated_bytes"] == 24_916_034_560


def test_decomfl_names_the_users_line_not_the_standard_librarys(capsys):
    # the interpreter lives outside the venv (uv): copy.py is the standard library, client.py:185 the user's
    (dev,) = _stats(os.path.join(require(REAL2), "decomfl_memory.pickle"), capsys, "--top", "400")["devices"]
    frames = [t["frame"] for t in dev["top_allocations"] if t["frame"]]
    assert not any(f["filename"].endswith("copy.py") for f in frames)
    assert any(f["filename"].endswith("cezo_fl\\client.py") and f["line"] == 185 for f in frames)


def test_bcrafton_compiled_code_is_named_by_the_models_line(capsys):
    (dev,) = _stats(os.path.join(require(REAL2), "bcrafton_memory_snapshot.pickle"), capsys, "--top", "3000")["devices"]
    generated = [t for t in dev["top_allocations"] if t["generated"]]
    assert 840 * 2**20 < sum(t["bytes"] for t in generated) < 850 * 2**20  # 845 MiB in /tmp/torchinductor_*
    assert all("/torchinductor_" in t["generated"]["filename"] for t in generated)
    assert all(t["frame"] is None or "/torchinductor_" not in t["frame"]["filename"] for t in dev["top_allocations"])
    assert any(t["frame"] and t["frame"]["filename"].endswith("cs336_basics/model.py") for t in generated)


@pytest.mark.parametrize("name", ALL)
def test_viewer_page_of_each_real_snapshot(name, browser, tmp_path):
    from tbmem._internal.snapshot.allocator import allocator_state
    from tbmem._internal.snapshot.readers import load_snapshot

    src = path_of(name)
    out = tmp_path / "page.html"
    assert main(["snapshot", "html", src, "-o", str(out)]) == 0
    page, requests, errors = open_page(browser, out)
    snap = load_snapshot(src)
    dev = snap.devices[snap.device_index(page.evaluate("window.tbmemViewer.device()"))]
    assert filled_pixels(page) > 300  # the timeline, state-only snapshots included (octreenca: 35.9 s of 6 MiB)
    assert max(page.evaluate("window.tbmemViewer.columns()")["top"]) == dev.peak_bytes()  # no peak lost
    stats = page.evaluate("window.tbmemViewer.stats()")
    assert [stats["peakEvent"], stats["peak"]] == list(dev.peak())
    # the allocator view is drawn at the peak, with Python's numbers
    assert page.evaluate("window.tbmemViewer.selected()") == dev.peak()[0]
    js = page.evaluate("window.tbmemViewer.allocator()")
    py = allocator_state(dev, dev.peak()[0], snap.categories)
    assert (js["reserved"], js["pending"], js["rounding"], js["split"], js["external"], js["segments"]) == \
        (py.reserved, py.pending_free, py.rounding, py.inactive_split, py.free_segments, len(py.segments))
    assert js["byCategory"] == py.by_category
    assert filled_pixels(page, "segments") > 1000
    reserved = dev.reserved_timeline()
    most = max([dev.baseline_reserved(), *(reserved.tolist() if reserved is not None else [])])
    assert max(page.evaluate("window.tbmemViewer.columns()")["resTop"]) == most  # the reserved timeline
    assert page.locator("#segtable tbody tr").count() > 0
    tip = hover_peak(page)
    assert "active" in tip and "torch::unwind" not in tip
    assert page.locator("#peak tbody tr").count() > 0
    assert requests == [] and errors == []
    page.close()
