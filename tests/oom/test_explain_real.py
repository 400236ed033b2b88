"""The explanation of every real out-of-memory event equals an independent replay written here.

The replay starts from the snapshot's final ``segments`` (blocks and their states, as torch wrote
them) and undoes the trace events after the ``oom`` event, newest first, on plain dicts: no tbmem
interval model, no numpy. At the OOM it reads the free gaps of each segment (contiguous mapped
ranges of an expandable segment joined), the largest per (pool, stream, small/large), and the live
bytes by allocation site.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tbmem._internal.oom.snapshot import explain_snapshot
from tbmem._internal.snapshot.readers import load_snapshot
from tbmem._internal.snapshot.safe_pickle import load_plain
from tbmem._internal.snapshot.stats import stats_doc
from tests._shared import REAL, require_shared

H200 = Path(__file__).resolve().parents[1] / "data" / "h200" / "oom.pickle"
CASES = [("real", "code_location_memory_snapshot.pickle"), ("h200", "oom.pickle")]


def _path(where: str, name: str) -> Path:
    return H200 if where == "h200" else require_shared(REAL) / name


def _round512(n: int) -> int:
    return max(512, -(-n // 512) * 512)


def _site(frames) -> str:
    """The innermost Python frame that is neither torch's nor the standard library's."""
    for f in frames or ():
        fn = f["filename"]
        if not fn.endswith(".py") or "/torch/" in fn or "\\torch\\" in fn:
            continue
        if ("/lib/python3" in fn and "site-packages" not in fn) or fn.startswith("<"):
            continue
        return f"{f['name']} ({fn}:{f['line']})"
    return "unnamed"


def replay(path: Path, device: int):
    data = load_plain(str(path))
    trace = data["device_traces"][device]
    oom = max(i for i, e in enumerate(trace) if e["action"] == "oom")
    segs = {}  # address -> [size, pool, stream, kind, expandable]
    blocks = {}  # address -> [extent, requested, pending, site]
    for s in data["segments"]:
        if s["device"] != device:
            continue
        segs[s["address"]] = [s["total_size"], tuple(s.get("segment_pool_id", (0, 0))), s["stream"],
                              s["segment_type"], s.get("is_expandable", False)]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = [b["size"], b["requested_size"], b["state"] == "active_pending_free",
                                        _site(b.get("frames"))]
    alloc_site, site_of_free = {}, {}
    for i, e in enumerate(trace):  # which allocation each free undoes (its site), forward
        if e["action"] == "alloc":
            alloc_site[e["addr"]] = _site(e.get("frames"))
        elif e["action"] == "free_completed":
            site_of_free[i] = alloc_site.pop(e["addr"], "before the trace")
    for i in range(len(trace) - 1, oom, -1):
        e = trace[i]
        act, addr, size = e["action"], e.get("addr"), e.get("size")
        if act == "alloc":
            del blocks[addr]
        elif act == "free_completed":
            blocks[addr] = [_round512(size), size, True, site_of_free[i]]
        elif act == "free_requested":
            blocks[addr][2] = False
        elif act == "segment_alloc":
            del segs[addr]
        elif act == "segment_free":
            segs[addr] = [size, (0, 0), e["stream"], "small" if size == 2 << 20 else "large", False]
        elif act in ("segment_map", "segment_unmap"):
            raise AssertionError("no mapping change after the OOM in these files")
    # contiguous mapped ranges of an expandable segment are one range
    ranges = []
    for a in sorted(segs):
        size, pool, stream, kind, exp = segs[a]
        if ranges and exp and ranges[-1][4] and ranges[-1][0] + ranges[-1][1] == a and ranges[-1][3] == stream:
            ranges[-1][1] += size
        else:
            ranges.append([a, size, pool, stream, exp, kind])
    largest, free_total = {}, 0
    for a, size, pool, stream, _, kind in ranges:
        inside = sorted(b for b in blocks if a <= b < a + size)
        cursor, gaps = a, []
        for b in inside:
            gaps.append(b - cursor)
            cursor = max(cursor, b + blocks[b][0])
        gaps.append(a + size - cursor)
        key = (pool, stream, kind)
        largest[key] = max(largest.get(key, 0), max(gaps))
        free_total += sum(g for g in gaps if g > 0)
    by_site = {}
    for extent, requested, pending, site in blocks.values():
        by_site[site] = by_site.get(site, 0) + requested
    return trace[oom], largest, free_total, by_site


@pytest.mark.parametrize("where,name", CASES)
def test_explanation_equals_an_independent_replay(where, name):
    path = _path(where, name)
    snap = load_snapshot(path)
    [(dev, x)] = explain_snapshot(snap)
    event, largest, free_total, by_site = replay(path, int(dev.name.split(":")[1]))
    assert (x.requested_bytes, x.device_free_bytes) == (event["size"], event["device_free"])
    got = {(tuple(g["pool"]), g["stream"], g["kind"]): g["largest_free_block_bytes"] for g in x.free_blocks}
    assert got == largest
    kind = "small" if event["size"] < 1 << 20 else "large"
    assert x.largest_free_block_bytes == max(v for k, v in largest.items() if k[2] == kind)
    assert sum(g["free_bytes"] for g in x.free_blocks) == free_total == x.inactive_split_bytes + x.free_segment_bytes
    assert x.largest_free_block_bytes < event["size"]  # it did fail
    mine: dict[str, int] = {}
    for row in x.live_by_site:
        site = row["site"] if not row["site"].startswith("(") else "unnamed"
        mine[site] = mine.get(site, 0) + row["bytes"]
    top = sorted(by_site.items(), key=lambda kv: -kv[1])[:len(x.live_by_site)]
    assert sorted(mine.items(), key=lambda kv: -kv[1]) == top or mine == dict(top)
    assert [r["bytes"] for r in x.live_by_site] == sorted((r["bytes"] for r in x.live_by_site), reverse=True)


def test_real_ooms_verdicts_settings_and_advice():
    snap = load_snapshot(_path("real", "code_location_memory_snapshot.pickle"))
    [(dev, x)] = explain_snapshot(snap)
    # expandable segments were on (the snapshot's allocator_settings): never advised
    assert x.settings["expandable_segments"] is True and x.settings["source"] == "snapshot"
    assert "expandable_segments" not in {a["kind"] for a in x.advice}
    # 4.9 GiB asked, 91 MiB free on the device, 133 MiB free in segments: full, not fragmented
    assert (dev.name, x.verdict) == ("cuda:1", "device_full")
    [advice] = [a for a in x.advice if a["kind"] == "reduce_live"]
    assert advice["bytes"] == x.requested_bytes - x.device_free_bytes - x.inactive_split_bytes - x.free_segment_bytes
    h200 = explain_snapshot(load_snapshot(H200))[0][1]
    assert h200.verdict == "device_full" and [a["kind"] for a in h200.advice] == ["request_size"]
    assert h200.settings["expandable_segments"] is False


@pytest.mark.parametrize("where,name", CASES)
def test_stats_json_oom_entries_carry_the_explanation(where, name):
    snap = load_snapshot(_path(where, name))
    [dev] = [d for d in stats_doc(snap)["devices"] if d["ooms"]]
    [o] = dev["ooms"]
    want = explain_snapshot(snap)[0][1].to_json()
    assert {k: o[k] for k in want} == want
    assert {"requested_bytes", "free_bytes", "time_us", "largest_free_block_bytes", "advice"} <= set(o)


def test_every_oom_event_of_every_real_snapshot_is_explained():
    from tests._shared import REAL2, real_pickles

    seen = 0
    for path in real_pickles(REAL) + real_pickles(REAL2):
        data = load_plain(str(path))
        want = sorted((d, i) for d, trace in enumerate(data.get("device_traces") or [])
                      for i, e in enumerate(trace) if e.get("action") == "oom")
        got = sorted((int(dev.name.split(":")[1]), x.event) for dev, x in explain_snapshot(load_snapshot(path)))
        assert got == want, path.name
        seen += len(got)
    assert seen == 1  # code_location's cuda:1 (the H200 one is in tests/data)
