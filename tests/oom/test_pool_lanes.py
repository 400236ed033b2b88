"""Memory per pool in the snapshot viewer: one lane per pool in the reserved timeline (real Chromium),
from a synthetic snapshot with two private pools (a CUDA graph's, a MemPool's) beside the default pool."""

from __future__ import annotations

import os

import pytest

from tbmem._internal.snapshot.cuda import convert_torch_snapshot
from tbmem._internal.snapshot.readers import load_snapshot
from tbmem._internal.snapshot.safe_pickle import load_plain
from tests._browser import CHROMIUM, chromium
from tests._shared import REAL2, require_shared
from tests.snapshot._page import open_page, write_page

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("TBMEM_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (apt-get install chromium)")
MiB = 2**20
USER = {"filename": "/home/u/train.py", "line": 42, "name": "forward"}


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _ev(action, addr, size, t, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": [USER],
            "time_us": 1_757_000_000_000_000 + t, **kw}


def _seg(addr, total, pool, blocks=()):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0, "segment_type": "large",
            "segment_pool_id": pool, "is_expandable": False, "frames": [], "blocks": list(blocks)}


def _block(addr, size):
    return {"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": [USER]}


def two_pool_snapshot(pool_ids: bool = False):
    """Default pool 20 MiB (before the trace), graph pool (0, 1) 40 MiB reserved during the trace, MemPool
    (0, 2) 8 MiB before the trace, and a 16 MiB default-pool segment reserved then released (``pool_ids``:
    each event carries its ``pool_id``, as torch >= 2.11 writes them)."""
    A, B, C, D = 0x10000000, 0x20000000, 0x30000000, 0x40000000
    p0, p1, p2 = ({"pool_id": p} for p in ((0, 0), (0, 1), (0, 2))) if pool_ids else ({}, {}, {})
    trace = [_ev("alloc", A, 4 * MiB, 0, **p0),
             _ev("segment_alloc", B, 40 * MiB, 10, **p1), _ev("alloc", B, 30 * MiB, 11, **p1),
             _ev("segment_alloc", D, 16 * MiB, 20, **p0), _ev("segment_free", D, 16 * MiB, 30, **p0),
             _ev("alloc", C, 2 * MiB, 40, **p2)]
    final = [_seg(A, 20 * MiB, (0, 0), [_block(A, 4 * MiB)]), _seg(B, 40 * MiB, (0, 1), [_block(B, 30 * MiB)]),
             _seg(C, 8 * MiB, (0, 2), [_block(C, 2 * MiB)])]
    return convert_torch_snapshot({"segments": final, "device_traces": [trace]}, kind="snapshot", step=0)


def test_one_reserved_lane_per_pool(browser, tmp_path):
    page, requests, errors = open_page(browser, write_page(tmp_path, two_pool_snapshot()))
    lanes = page.locator("#poollanes .pool-lane")
    names = [lanes.nth(i).get_attribute("data-pool") for i in range(lanes.count())]
    # the released default-pool segment has no final segment: its pool is not known, a lane of its own
    assert names == ["unknown", "0,0", "0,1", "0,2"]
    most = {(",".join(map(str, p["pool"])) if p["pool"] else "unknown"): p["most"]
            for p in page.evaluate("window.tbmemViewer.pools()")}
    assert most == {"unknown": 16 * MiB, "0,0": 20 * MiB, "0,1": 40 * MiB, "0,2": 8 * MiB}
    text = page.inner_text("#poollanes")
    assert "private pool (0, 1): a CUDA graph's or a MemPool's: at most 40.00 MiB reserved in view" in text
    # each lane is drawn: some pixels filled in the pool's colour
    filled = page.evaluate("""Array.from(document.querySelectorAll('#poollanes canvas')).map(function (c) {
        var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, n = 0;
        for (var i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
        return n; })""")
    assert len(filled) == 4 and all(n > 0 for n in filled)
    assert requests == [] and errors == []


def test_the_trace_pool_ids_put_a_released_segment_in_its_pool(browser, tmp_path):
    page, requests, errors = open_page(browser, write_page(tmp_path, two_pool_snapshot(pool_ids=True)))
    lanes = page.locator("#poollanes .pool-lane")
    assert [lanes.nth(i).get_attribute("data-pool") for i in range(lanes.count())] == ["0,0", "0,1", "0,2"]
    most = {",".join(map(str, p["pool"])): p["most"] for p in page.evaluate("window.tbmemViewer.pools()")}
    assert most == {"0,0": 36 * MiB, "0,1": 40 * MiB, "0,2": 8 * MiB}  # 20 MiB before the trace + 16 MiB at once
    assert requests == [] and errors == []


def test_no_lanes_when_only_the_default_pool(browser, tmp_path):
    seg = _seg(0x1000, 20 * MiB, (0, 0), [_block(0x1000, 4 * MiB)])
    snap = convert_torch_snapshot({"segments": [seg], "device_traces": [[_ev("alloc", 0x1000, 4 * MiB, 0)]]},
                                  kind="snapshot", step=0)
    page, _r, errors = open_page(browser, write_page(tmp_path, snap))
    assert page.locator("#poollanes .pool-lane").count() == 0 and page.evaluate("window.tbmemViewer.pools()") == []
    assert errors == []


def test_a_real_snapshot_with_cuda_graph_pools_has_their_lanes(browser, tmp_path):
    # verl (vLLM rollout): CUDA-graph private pools (0, 1) and (0, 2) beside the default pool, no trace events
    path = require_shared(REAL2) / "verl_mem.pickle"
    expected: dict[str, int] = {}
    for seg in load_plain(str(path))["segments"]:  # an independent sum of each pool's segments
        key = ",".join(map(str, seg["segment_pool_id"]))
        expected[key] = expected.get(key, 0) + seg["total_size"]
    assert set(expected) == {"0,0", "0,1", "0,2"}
    page, requests, errors = open_page(browser, write_page(tmp_path, load_snapshot(path)))
    lanes = page.locator("#poollanes .pool-lane")
    assert [lanes.nth(i).get_attribute("data-pool") for i in range(lanes.count())] == ["0,0", "0,1", "0,2"]
    most = {",".join(map(str, p["pool"])): p["most"] for p in page.evaluate("window.tbmemViewer.pools()")}
    assert most == expected
    assert requests == [] and errors == []
