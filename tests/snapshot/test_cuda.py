"""Conversion of torch.cuda.memory._snapshot() dicts: one unit case per defect of issue 11 (no GPU here)."""

from __future__ import annotations

import numpy as np
import pytest

from tbmem._internal.snapshot.cuda import CATEGORIES, convert_torch_snapshot
from tbmem._internal.snapshot.schema import FLAG_FREE_SITE, FLAG_PENDING_FREE
from tbmem._internal.snapshot.stats import stats_doc, stats_text

TORCH = "/env/lib/python3.11/site-packages/torch"
USER = {"filename": "/home/u/train.py", "line": 42, "name": "forward"}
BWD = {"filename": f"{TORCH}/autograd/graph.py", "line": 824, "name": "_engine_run_backward"}
OPT = {"filename": f"{TORCH}/optim/adam.py", "line": 100, "name": "_single_tensor_adam"}
MODULE = {"filename": f"{TORCH}/nn/modules/module.py", "line": 1750, "name": "_call_impl"}
UNWIND = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}
ENGINE = {"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"}
T0 = 1_757_000_000_000_000


def _ev(action, addr, size, t, frames, **kw):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames, **kw}
    if t is not None:
        e["time_us"] = T0 + t
    return e


def _replay_peak(trace, baseline):
    """An independent replay: alloc .. free_completed, plus what was alive before the trace."""
    live, cur, peak = {}, baseline, baseline
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= live.pop(e["addr"], e["size"])
        peak = max(peak, cur)
    return peak


def test_pending_free_is_counted_once():
    # a free requested but not completed when the snapshot was taken: the block is still active
    trace = [_ev("alloc", 0x1000, 512, 1, [USER]), _ev("free_requested", 0x1000, 512, 2, [USER])]
    seg = {"device": 0, "address": 0x1000, "total_size": 2 << 20, "blocks": [
        {"address": 0x1000, "size": 512, "requested_size": 512, "state": "active_pending_free", "frames": [USER]}]}
    snap = convert_torch_snapshot({"segments": [seg], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.allocs["size"].tolist() == [512]  # the old conversion added the block a second time
    assert snap.allocs["flags"][0] & FLAG_PENDING_FREE and snap.allocs["end"][0] == -1
    assert snap.main.final_bytes() == 512 and snap.peak_bytes() == 512


def test_memory_alive_before_the_trace_is_in_the_peak():
    # 1 GiB allocated before recording, freed late; 4 GiB of parameters still alive (segments)
    trace = [_ev("alloc", 0x10, 1 << 20, 1, [USER]), _ev("free_requested", 0x99, 1 << 30, 2, [USER]),
             _ev("free_completed", 0x99, 1 << 30, 3, [USER]), _ev("free_completed", 0x10, 1 << 20, 4, [USER])]
    seg = {"device": 0, "address": 0x5000, "total_size": 4 << 30, "blocks": [
        {"address": 0x5000, "size": 4 << 30, "requested_size": 4 << 30, "state": "active_allocated",
         "frames": [MODULE, USER]}]}
    snap = convert_torch_snapshot({"segments": [seg], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.main.baseline_bytes() == (1 << 30) + (4 << 30)
    assert snap.peak_bytes() == _replay_peak(trace, (1 << 30) + (4 << 30)) == (5 << 30) + (1 << 20)
    assert snap.peak() == (0, (5 << 30) + (1 << 20))


def test_free_site_stack_is_not_the_allocation_site():
    trace = [_ev("free_requested", 0x99, 4096, 1, [USER]), _ev("free_completed", 0x99, 4096, 2, [USER])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.allocs["flags"][0] & FLAG_FREE_SITE and snap.allocs["start"][0] == -1
    assert snap.categories[snap.allocs["category"][0]] == "before trace"
    top = stats_doc(snap)["devices"][0]["top_allocations"][0]
    assert top["frame"] is None and top["category"] == "before trace"
    assert "stack of its free" in stats_text(snap)


def test_t0_unix_is_the_traces_first_event():
    trace = [_ev("alloc", 8, 100, 5, [USER])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.t0_unix == (T0 + 5) / 1e6


def test_without_time_us_no_clock_is_invented():
    trace = [_ev("alloc", 8, 100, None, [USER]), _ev("free_completed", 8, 100, None, [USER])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.t0_unix is None and not snap.main.has_time
    text = stats_text(snap)
    assert "0.000" not in text and "the trace has no times" in text


def test_list_of_segments_is_accepted():
    segs = [{"device": 0, "address": 0x100, "total_size": 1 << 21, "blocks": [
        {"address": 0x100, "size": 1 << 20, "requested_size": 1000, "state": "active_allocated", "frames": []}]},
        {"device": 1, "address": 0x900, "total_size": 1 << 22, "blocks": []}]
    snap = convert_torch_snapshot(segs, kind="snapshot", step=0)
    doc = stats_doc(snap)["devices"]
    # allocated: the block as the allocator rounded it (torch's memory_allocated); requested: what was asked
    assert [(d["device"], d["reserved_bytes"], d["allocated_bytes"], d["requested_bytes"]) for d in doc] == [
        ("cuda:0", 1 << 21, 1 << 20, 1000), ("cuda:1", 1 << 22, 0, 0)]


def test_every_device_and_the_default_is_the_largest_peak():
    # more entries on cuda:0, the memory on cuda:1: the old conversion showed an empty cuda:0
    small = [_ev("alloc", 8 * i, 16, i, [USER]) for i in range(10)]
    big = [_ev("alloc", 8, 1 << 30, 1, [USER])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [small, big, []]}, kind="snapshot", step=0)
    assert [d.name for d in snap.devices] == ["cuda:0", "cuda:1"]
    assert snap.device == "cuda:1" and snap.peak_bytes() == 1 << 30


def test_oom_device_is_the_default_and_its_oom_is_reported():
    a = [_ev("alloc", 8, 1 << 30, 1, [USER])]
    b = [_ev("alloc", 8, 1 << 20, 1, [USER]), _ev("oom", 0, 5 << 30, 9, [USER])]
    b[1]["device_free"] = 3 << 20
    del b[1]["addr"]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [a, b]}, kind="snapshot", step=0)
    assert snap.device == "cuda:1"
    doc = stats_doc(snap, device="cuda:1")["devices"][0]
    [o] = doc["ooms"]
    assert (o["requested_bytes"], o["free_bytes"], o["time_us"]) == (5 << 30, 3 << 20, T0 + 9)
    assert "OUT OF MEMORY" in stats_text(snap)


@pytest.mark.parametrize("frames, expected", [
    ([], "no stack"), ([UNWIND, ENGINE], "backward"), ([UNWIND], "c++ only"),
    ([UNWIND, MODULE, USER], "python code"), ([BWD, USER], "backward"), ([OPT, USER], "optimizer"),
])
def test_category_says_what_the_stack_shows(frames, expected):
    snap = convert_torch_snapshot({"segments": [], "device_traces": [[_ev("alloc", 8, 64, 1, frames)]]},
                                  kind="snapshot", step=0)
    cat = snap.categories[snap.allocs["category"][0]]
    assert cat == expected and cat in CATEGORIES and "activation" not in snap.categories


def test_cpp_frames_are_never_the_allocation_site():
    stack = [UNWIND, {"filename": "RegisterCUDA.cpp", "line": 0, "name": "at::wrapper_CUDA_mm"}, MODULE, USER]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [[_ev("alloc", 8, 64, 1, stack)]]},
                                  kind="snapshot", step=0)
    assert stats_doc(snap)["devices"][0]["top_allocations"][0]["frame"] == {
        "filename": "/home/u/train.py", "line": 42, "name": "forward"}


def test_every_action_of_torch_1_13_to_2_13():
    trace = [
        _ev("segment_alloc", 0x1000, 2 << 20, 1, [USER]), _ev("segment_map", 0x1000, 2 << 20, 2, [USER],
                                                              compile_context="N/A", user_metadata="tbmem:forward"),
        _ev("alloc", 0x1000, 512, 3, [USER], compile_context="N/A", user_metadata="tbmem:forward"),
        _ev("snapshot", 0, 0, 4, []),
        _ev("free_requested", 0x1000, 512, 5, [USER], user_metadata="tbmem:backward"),
        _ev("free_completed", 0x1000, 512, 6, [USER]), _ev("segment_unmap", 0x1000, 2 << 20, 7, []),
        _ev("segment_free", 0x1000, 2 << 20, 8, []),
    ]
    ann = [{"stage": "START", "name": "tbmem:step 3", "device": 0, "time_us": T0 + 3},
           {"stage": "END", "name": "tbmem:step 3", "device": 0, "time_us": T0 + 4},
           {"stage": "START", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": T0 + 5}]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace], "external_annotations": ann,
                                   "allocator_settings": {"expandable_segments": True}}, kind="snapshot", step=0)
    dev = snap.main
    assert dev.n_events == 8 and dev.allocs["start"].tolist() == [2] and dev.allocs["end"].tolist() == [5]
    labels = {(m["kind"], m["label"]) for m in dev.markers}
    assert {("step", "step 3"), ("annotation", "Optimizer.step#AdamW.step"), ("phase", "forward"),
            ("phase", "backward"), ("snapshot", "snapshot")} <= labels
    assert snap.meta["allocator_settings"] == {"expandable_segments": True}


def test_address_reuse_pairs_each_alloc_with_its_own_free():
    trace = [_ev("alloc", 8, 100, 1, [USER]), _ev("free_completed", 8, 100, 2, [USER]),
             _ev("alloc", 8, 300, 3, [USER]), _ev("free_requested", 8, 300, 4, [USER]),
             _ev("free_completed", 8, 300, 5, [USER]), _ev("alloc", 8, 50, 6, [USER])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    a = snap.allocs
    assert sorted(zip(a["start"].tolist(), a["end"].tolist(), a["size"].tolist())) == [
        (0, 1, 100), (2, 4, 300), (5, -1, 50)]
    assert np.array_equal(snap.timeline(), [100, 0, 300, 300, 0, 50])


@pytest.mark.gpu
def test_real_cuda_capture_marks_steps_and_finds_this_file(tmp_path):
    import os

    import torch

    from tbmem import MemoryWriter
    from tbmem._internal.snapshot import SnapshotConfig, load_snapshot

    torch.zeros(1, device="cuda")
    with MemoryWriter(tmp_path, every=1, snapshot=SnapshotConfig(steps=(2,))) as writer:
        for step in range(3):
            x = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
            writer.log_memory(step)
    snap = load_snapshot(tmp_path / "plugins/tbmem/snapshot_rank0_step000000002.json.gz")
    assert snap.source == "cuda" and snap.n_events > 0 and snap.device.startswith("cuda:")
    assert any(m["kind"] == "step" for m in snap.main.markers)
    # the largest block this thread made inside the window: blocks alive before the recording (cuBLAS's
    # workspace, earlier tests' tensors) and autograd's thread carry no Python frames
    rows = stats_doc(snap, top=50)["devices"][0]["top_allocations"]
    top = next((t for t in rows if t["category"] == "python code"), None)
    assert top is not None and top["frame"]["filename"] == os.path.abspath(__file__), stats_text(snap)
    assert (tmp_path / "plugins/tbmem/snapshot_rank0_step000000002.pickle").exists()
    raw = load_snapshot(tmp_path / "plugins/tbmem/snapshot_rank0_step000000002.pickle")
    assert raw.peak_bytes() == snap.peak_bytes()
