"""The real CUDA snapshots of ../shared/snapshots/real/: every fact of their README, via ``stats --json``,
and each one's viewer page in headless Chromium with every request blocked."""

from __future__ import annotations

import json
import os

import pytest

from tbmem._internal.cli import main
from tests._shared import REAL, require_shared


@pytest.fixture(autouse=True)
def _real_snapshots():
    require_shared(REAL)  # a skip with its reason in a clone, a failure in CI

MiB = 2**20

# From README.md of the real snapshots: (device, reserved bytes, peak of allocated bytes)
FACTS = {
    "magma27_memory_snapshot.pickle": [("cuda:0", 14_180_941_824, 13_923_997_700)],
    "kkaitlyn_memory_ctx128_fullstep.pickle": [("cuda:0", 61_111_009_280, 54_802_667_524)],
    "code_location_memory_snapshot.pickle": [("cuda:0", 8_541_700_096, 8_456_473_388),
                                             ("cuda:1", 84_202_749_952, 84_063_351_764),
                                             ("cuda:2", 21_883_781_120, 21_564_645_800)],
    "select_n_04d383c_snapshot.pickle": [("cuda:0", 18_566_086_656, 20_802_383_104)],
}
# The largest traced allocation and its first Python frame outside torch: (device, bytes, name, path end, line)
SITES = {
    "magma27_memory_snapshot.pickle": ("cuda:0", 312.5 * MiB, "einsum", "einops/_backends.py", 291),
    "kkaitlyn_memory_ctx128_fullstep.pickle": ("cuda:0", 157.0 * MiB, "cross_entropy_loss",
                                               "cs336_basics/training.py", 21),
    "code_location_memory_snapshot.pickle": ("cuda:0", 592.5 * MiB, "to", "transformers/modeling_utils.py", 4346),
    "select_n_04d383c_snapshot.pickle": ("cuda:0", 1.95 * 2**30, "forward",
                                         "transformers/models/llama/modeling_llama.py", 856),
}


def _stats(name, capsys, *extra):
    assert main(["snapshot", "stats", os.path.join(REAL, name), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_readme_facts_to_the_byte(name, capsys):
    doc = _stats(name, capsys, "--top", "20")
    devices = {d["device"]: d for d in doc["devices"]}
    assert [(dev, devices[dev]["reserved_bytes"], devices[dev]["peak_bytes"]) for dev, _r, _p in FACTS[name]] \
        == FACTS[name]
    assert set(devices) == {dev for dev, _r, _p in FACTS[name]}  # empty device traces are not devices
    dev, size, fn, path, line = SITES[name]
    sites = [(t["frame"]["name"], t["frame"]["filename"].replace("\\", "/"), t["frame"]["line"])
             for t in devices[dev]["top_allocations"] if t["frame"] and abs(t["bytes"] - size) < 0.01 * size]
    assert any(f == fn and p.endswith(path) and ln == line for f, p, ln in sites), sites
    # never a C++ frame, never "activation": what the stack shows
    for d in doc["devices"]:
        for t in d["top_allocations"]:
            assert t["frame"] is None or t["frame"]["filename"].endswith(".py")
            assert t["category"] != "activation"


def test_three_gpus_and_the_oom_on_cuda_1(capsys):
    doc = _stats("code_location_memory_snapshot.pickle", capsys)
    oom = {d["device"]: d["ooms"] for d in doc["devices"]}
    assert oom["cuda:0"] == [] and oom["cuda:2"] == []
    [o] = oom["cuda:1"]
    assert (o["requested_bytes"], o["free_bytes"], o["time_us"]) == (5_308_694_528, 95_682_560, 1_757_253_257_949_855)
    assert main(["snapshot", "stats", os.path.join(REAL, "code_location_memory_snapshot.pickle")]) == 0
    text = capsys.readouterr().out
    assert "== cuda:1 (default)" in text and "OUT OF MEMORY" in text and "4.9 GiB" in text


def test_backward_of_the_autograd_engine_is_labelled_backward(capsys):
    # 28 GiB allocated by the engine's threads (C++ stacks only) were "activation"/"unknown" before
    from tbmem._internal.snapshot.readers import load_snapshot

    snap = load_snapshot(os.path.join(REAL, "kkaitlyn_memory_ctx128_fullstep.pickle"))
    a = snap.allocs
    backward = a["size"][(a["category"] == snap.categories.index("backward")) & (a["start"] >= 0)].sum()
    assert 28 * 2**30 < backward < 29 * 2**30


def test_no_time_us_and_t0_from_the_trace(capsys):
    from tbmem._internal.snapshot.readers import load_snapshot

    old = load_snapshot(os.path.join(REAL, "select_n_04d383c_snapshot.pickle"))
    assert old.t0_unix is None and not old.main.has_time
    assert load_snapshot(os.path.join(REAL, "magma27_memory_snapshot.pickle")).t0_unix == 1776479641.085368


@pytest.mark.parametrize("name", sorted(FACTS))
def test_viewer_page_of_each_real_snapshot(name, browser, tmp_path, capsys):
    from tests.snapshot.test_viewer import _open, drawn_pixels, hover_peak

    out = tmp_path / (name + ".html")
    assert main(["snapshot", "html", os.path.join(REAL, name), "-o", str(out)]) == 0
    page, requests, errors = _open(browser, out)
    assert drawn_pixels(page) > 2000
    stats = page.evaluate("window.tbmemViewer.stats()")
    default = page.evaluate("window.tbmemViewer.device()")
    facts = dict((d, p) for d, _r, p in FACTS[name])
    assert stats["peak"] == facts[default]
    tip = hover_peak(page)
    assert "active" in tip and "torch::unwind" not in tip  # C++ frames hidden unless asked
    options = page.locator("#device option").all_inner_texts()
    assert [o.split(" ")[0] for o in options] == sorted(facts)
    assert requests == [] and errors == []
    page.close()
