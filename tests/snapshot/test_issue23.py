"""Issue 23's defects on the Python side, each with a synthetic case in torch's format: torch 2.0 block
history, the peak before the first event, segments over time, the allocator's state, frames."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tbmem._internal.snapshot.allocator import allocator_state
from tbmem._internal.snapshot.cuda import convert_torch_snapshot
from tbmem._internal.snapshot.cuda_replay import pair_allocations
from tbmem._internal.snapshot.frames import FrameClassifier
from tbmem._internal.snapshot.pickle_rows import ACTION_CODE
from tbmem._internal.snapshot.stats import stats_doc, stats_text

USER = {"filename": "/home/u/train.py", "line": 42, "name": "forward"}
MiB = 2**20


def _ev(action, addr, size, frames=(USER,), **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), **kw}


def _seg(addr, total, blocks, **kw):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks, **kw}


def test_torch_2_0_blocks_take_their_stack_and_request_from_history():
    # torch 2.0: no "frames" and no "address" on blocks; the stack is in history[0]
    hist = [{"addr": 0x1000, "real_size": 3 * MiB, "frames": [
        {"filename": "/home/u/flexgen/pytorch_backend.py", "line": 195, "name": "allocate"}]}]
    seg = {"device": 0, "address": 0x1000, "total_size": 20 * MiB, "stream": 0, "segment_type": "large", "blocks": [
        {"size": 4 * MiB, "requested_size": 3 * MiB, "state": "active_allocated", "history": hist},
        {"size": 16 * MiB, "requested_size": 0, "state": "inactive", "history": []}]}
    snap = convert_torch_snapshot({"segments": [seg], "device_traces": [[]]}, kind="snapshot", step=0)
    (top,) = stats_doc(snap, top=1)["devices"][0]["top_allocations"]
    assert top["frame"] == {"filename": "/home/u/flexgen/pytorch_backend.py", "line": 195, "name": "allocate"}
    assert top["bytes"] == 3 * MiB and top["category"] == "python code"
    assert int(snap.allocs["round"][0]) == MiB  # block size minus the request


def test_the_state_before_the_first_event_can_be_the_peak():
    # flexgen_6a8eab0: the only event frees a block alive before the trace
    seg = _seg(0x1000, 20 * MiB, [{"address": 0x1000, "size": 8 * MiB, "requested_size": 8 * MiB,
                                   "state": "active_allocated", "frames": [USER]}])
    trace = [_ev("free_completed", 0x900000, 2 * MiB)]
    snap = convert_torch_snapshot({"segments": [seg], "device_traces": [trace]}, kind="snapshot", step=0)
    assert snap.peak() == (-1, 10 * MiB) and snap.main.baseline_bytes() == 10 * MiB
    d = stats_doc(snap)["devices"][0]
    assert (d["peak_bytes"], d["peak_event"]) == (10 * MiB, -1)
    assert "peak 10.0 MiB before the first event" in stats_text(snap)  # not "at before the first event"


def test_an_empty_snapshot_is_no_device():
    snap = convert_torch_snapshot({"segments": [], "device_traces": []}, kind="snapshot", step=0)
    text = stats_text(snap)
    assert "cuda:0" not in text and "no device" in text


def test_segments_replayed_through_alloc_free_map_and_unmap():
    final = [_seg(0x10000000, 40 * MiB, [], is_expandable=True, segment_pool_id=(0, 1)),
             _seg(0x20000000, 20 * MiB, [])]
    trace = [_ev("segment_alloc", 0x30000000, 2 * MiB, (), stream=7),     # 0: reserved, freed at 1
             _ev("segment_free", 0x30000000, 2 * MiB, ()),                # 1
             _ev("segment_map", 0x10000000 + 20 * MiB, 20 * MiB, ()),     # 2: the second half of the expandable one
             _ev("segment_unmap", 0x40000000, 4 * MiB, ()),               # 3: reserved before the trace
             _ev("segment_alloc", 0x20000000, 20 * MiB, ())]              # 4: the final large one
    snap = convert_torch_snapshot({"segments": final, "device_traces": [trace]}, kind="snapshot", step=0)
    dev = snap.main
    assert dev.reserved_timeline().tolist() == [m * MiB for m in (26, 24, 44, 40, 60)]
    assert dev.baseline_reserved() == 24 * MiB  # the first half of the expandable segment, and the unmapped 4 MiB
    assert dev.reserved_bytes == 60 * MiB
    seg = dev.segs
    mine = seg["addr"] == 0x30000000
    assert dev.streams[int(seg["stream"][mine][0])] == 7  # a segment event's stream
    pools = {tuple(dev.pools[p]) for p in seg["pool"][seg["pool"] >= 0].tolist()}
    assert pools == {(0, 0), (0, 1)}
    # the two mapped halves of the expandable segment count as one segment
    st = allocator_state(dev, 4, snap.categories)
    assert st.n_segments == len(st.segments) == 2 and st.free_segments == 60 * MiB and st.reserved == 60 * MiB


def test_reserved_splits_exactly_into_allocated_pending_rounding_split_and_free():
    blocks = [{"address": 0x1000, "size": 2 * MiB, "requested_size": 2 * MiB - 100, "state": "active_allocated",
               "frames": [USER]},
              {"address": 0x1000 + 2 * MiB, "size": MiB, "requested_size": MiB, "state": "active_pending_free",
               "frames": [USER]},
              {"address": 0x1000 + 3 * MiB, "size": 17 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    segs = [_seg(0x1000, 20 * MiB, blocks), _seg(0x9000000, 2 * MiB, [{"address": 0x9000000, "size": 2 * MiB,
                                                                        "requested_size": 0, "state": "inactive"}])]
    snap = convert_torch_snapshot({"segments": segs, "device_traces": [[]]}, kind="snapshot", step=0)
    st = allocator_state(snap.main, -1, snap.categories)
    assert st.by_category == {"python code": 2 * MiB - 100} and st.pending_free == MiB and st.rounding == 100
    assert st.inactive_split == 17 * MiB and st.free_segments == 2 * MiB and st.reserved == 22 * MiB
    x = stats_doc(snap)["devices"][0]["explain"]
    assert (x["pending_free_bytes"], x["rounding_bytes"], x["releasable_segments"]) == (MiB, 100, 1)
    assert "internal fragmentation 17.0 MiB" in stats_text(snap) and "external free 2.0 MiB" in stats_text(snap)


def _reference_pairs(act, addr):
    """A straightforward replay: each alloc ends at the next free_completed of its address."""
    alloc, freereq, out, lone_done = {}, {}, [], []
    for i, (a, ad) in enumerate(zip(act, addr)):
        if a == ACTION_CODE["alloc"]:
            if ad in alloc:
                out.append((alloc.pop(ad), i, freereq.pop(ad, -1)))
            alloc[ad] = i
        elif a == ACTION_CODE["free_requested"] and ad in alloc:
            freereq.setdefault(ad, i)
        elif a == ACTION_CODE["free_completed"]:
            if ad in alloc:
                out.append((alloc.pop(ad), i, freereq.pop(ad, -1)))
            else:
                lone_done.append(i)
    out += [(s, -1, freereq.get(ad, -1)) for ad, s in alloc.items()]
    return sorted(out), sorted(lone_done)


def test_pairing_matches_a_straightforward_replay():
    rng = random.Random(3)
    for _ in range(30):
        act, addr = [], []
        for _ in range(rng.randint(1, 300)):
            act.append(rng.choice([1, 1, 2, 3, 3, 4]))
            addr.append(rng.choice([64, 128, 192, 256]))
        p = pair_allocations(np.array(act), np.array(addr))
        got = sorted(zip(p.starts.tolist(), p.ends.tolist(), p.freereq.tolist()))
        ours, lone = _reference_pairs(act, addr)
        assert got == ours and sorted(p.lone_done.tolist()) == lone


def test_standard_library_found_from_the_snapshots_own_paths():
    # decomfl: uv installs the interpreter outside the venv; copy.py there is the standard library
    names = [r"C:\Users\Z\AppData\Roaming\uv\python\cpython-3.10.19-windows-x86_64-none\lib\copy.py",
             r"C:\research\DeComFL\.venv\lib\site-packages\torch\_tensor.py", r"C:\research\DeComFL\cezo_fl\client.py",
             "/home/u/.pyenv/versions/3.10.4/lib/python3.10/contextlib.py", r"C:\Users\x\anaconda3\envs\ml\Lib\threading.py",
             "/home/u/proj/lib/copy.py"]
    fc = FrameClassifier.for_paths(names, local=False)
    assert [fc.kind(n) for n in names] == ["library", "library", "user", "library", "library", "user"]


def test_generated_and_internal_frames():
    fc = FrameClassifier.for_paths([], local=False)
    assert fc.kind("/tmp/torchinductor_brian/si/csiptpjn.py") == "generated"
    assert fc.kind("<eval_with_key>.12") == "generated"
    assert [fc.kind_of("??", n) for n in ("torch::unwind::unwind()", "torch::CapturedTraceback::gather(bool)",
                                          "_PyEval_EvalFrameDefault", "PyObject_Call", "at::native::mm")] == \
        ["internal", "internal", "internal", "internal", "cpp"]


def test_cpp_names_the_operator_not_the_unwinder_and_compiled_code_the_models_line():
    unwind = [{"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
              {"filename": "??", "line": 0, "name": "torch::CapturedTraceback::gather(bool, bool, bool)"},
              {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::malloc"}]
    op = {"filename": "??", "line": 0, "name": "at::native::empty_cuda(c10::ArrayRef<long>)"}
    gen = {"filename": "/tmp/torchinductor_u/ab/cabc.py", "line": 102, "name": "call"}
    model = {"filename": "/home/u/model.py", "line": 57, "name": "forward"}
    trace = [_ev("alloc", 64, 2 * MiB, unwind + [op]), _ev("alloc", 4096 * 1024, MiB, unwind + [gen, model])]
    snap = convert_torch_snapshot({"segments": [], "device_traces": [trace]}, kind="snapshot", step=0)
    assert "at::native::empty_cuda" in stats_text(snap, cpp=True) and "torch::unwind" not in stats_text(snap, cpp=True)
    rows = stats_doc(snap)["devices"][0]["top_allocations"]
    assert rows[1]["frame"] == {"filename": "/home/u/model.py", "line": 57, "name": "forward"}
    assert rows[1]["generated"]["filename"] == "/tmp/torchinductor_u/ab/cabc.py"
    assert "torch.compile's generated code" in stats_text(snap)


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_traces_have_integer_ticks_in_python_too(n):
    # (the viewer's ticks are checked in the browser; here the conversion of 0-1 event traces)
    trace = [_ev("alloc", 64, 1024)][:n]
    snap = convert_torch_snapshot({"segments": [_seg(0, 2 * MiB, [])], "device_traces": [trace]}, kind="snapshot",
                                  step=0)
    assert snap.main.n_events == n and snap.peak_bytes() == 1024 * n


def test_a_mapped_range_across_two_final_segments_is_cut_at_their_edge():
    from tbmem._internal.snapshot.cuda_segments import FinalSegment, segment_pieces

    final = [FinalSegment(addr=0, size=16 * MiB, stream=0, pool=(0, 0), stack=-1, flags=1),
             FinalSegment(addr=16 * MiB, size=16 * MiB, stream=0, pool=(0, 0), stack=-1, flags=1)]
    p = segment_pieces(np.array([ACTION_CODE["segment_map"]]), np.array([10 * MiB]), np.array([20 * MiB]),
                       np.array([-1]), {}, final)
    c = {k: v.tolist() for k, v in p.cols.items()}
    assert sorted(zip(c["addr"], c["size"], c["start"])) == [
        (0, 10 * MiB, -1), (10 * MiB, 6 * MiB, 0), (16 * MiB, 14 * MiB, 0), (30 * MiB, 2 * MiB, -1)]
