"""Conversion of torch.cuda.memory._snapshot() dicts (hand-made: no GPU here)."""

from __future__ import annotations

import pytest

from tbmem.snapshot.cuda import convert_torch_snapshot, guess_category

USER = {"filename": "/home/u/train.py", "line": 42, "name": "forward"}
BWD = {"filename": "/x/site-packages/torch/autograd/graph.py", "line": 824, "name": "_engine_run_backward"}
OPT = {"filename": "/x/site-packages/torch/optim/adam.py", "line": 100, "name": "_single_tensor_adam"}


def _ev(action, addr, size, t, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames}


def _torch_dict():
    fwd, bwd, opt = [USER], [BWD, USER], [OPT, USER]
    trace = [
        _ev("segment_alloc", 0x1000, 2 << 20, 1, fwd),
        _ev("alloc", 0x1000, 512, 2, fwd),
        _ev("alloc", 0x1200, 1024, 3, bwd),
        _ev("free_requested", 0x1000, 512, 4, fwd),
        _ev("free_completed", 0x1000, 512, 5, fwd),
        _ev("free_completed", 0x9000, 256, 6, opt),   # allocated before recording started
        _ev("alloc", 0x1600, 2048, 7, opt),
        _ev("oom", 0, 1 << 30, 8, []),
    ]
    seg = {"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 0, "blocks": [
        {"address": 0x1000, "size": 512, "state": "inactive", "frames": []},
        {"address": 0x1200, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": bwd},
        {"address": 0x1600, "size": 2048, "requested_size": 2048, "state": "active_allocated", "frames": opt},
        {"address": 0x2000, "size": 4096, "requested_size": 4000, "state": "active_allocated", "frames": fwd},
    ]}
    return {"segments": [seg], "device_traces": [trace]}


def test_conversion_intervals_and_preexisting_blocks():
    snap = convert_torch_snapshot(_torch_dict(), kind="oom", step=9, rank=2)
    a = snap.allocs
    rows = sorted(zip(a["addr"].tolist(), a["size"].tolist(), a["start"].tolist(), a["end"].tolist(),
                      [snap.categories[c] for c in a["category"]]))
    assert rows == [
        (0x1000, 512, 0, 2, "activation"),          # alloc .. free_completed
        (0x1200, 1024, 1, -1, "backward"),          # still alive
        (0x1600, 2048, 4, -1, "optimizer"),
        (0x2000, 4000, -1, -1, "activation"),       # active block without alloc in the trace
        (0x9000, 256, -1, 3, "optimizer"),          # freed, never allocated in the trace
    ]
    assert snap.n_events == 5 and snap.time_us.tolist() == [0, 1, 3, 4, 5]
    assert snap.kind == "oom" and snap.rank == 2 and snap.device == "cuda:0"
    assert snap.meta["reserved_bytes"] == 2 << 20 and snap.meta["oom_events"] == [{"size": 1 << 30, "device_free": 0}]
    i = a["addr"].tolist().index(0x1200)
    assert snap.stack_frames(int(a["stack"][i])) == [(BWD["filename"], 824, BWD["name"]), ("/home/u/train.py", 42, "forward")]
    # peak: 4000 + 256 + 512 + 1024 after event 1 = 5792; after event 4: 4000 + 1024 + 2048
    assert snap.peak() == (4, 4000 + 1024 + 2048)


def test_free_requested_without_completion_ends_at_request():
    d = {"segments": [], "device_traces": [[_ev("alloc", 8, 100, 10, [USER]), _ev("free_requested", 8, 100, 20, [USER])]]}
    snap = convert_torch_snapshot(d, kind="snapshot", step=0)
    assert snap.allocs["end"].tolist() == [1] and snap.time_us.tolist() == [0, 10]


def test_picks_the_device_with_events():
    d = {"segments": [], "device_traces": [[], [_ev("alloc", 8, 100, 10, [USER])]]}
    assert convert_torch_snapshot(d, kind="snapshot", step=0).device == "cuda:1"


@pytest.mark.parametrize("frames, expected", [([], "unknown"), ([("a.py", 1, "f")], "activation"),
                                              ([(BWD["filename"], 1, "x")], "backward"),
                                              ([(OPT["filename"], 1, "step")], "optimizer")])
def test_guess_category(frames, expected):
    assert guess_category(frames) == expected


@pytest.mark.gpu
def test_real_cuda_capture(tmp_path):
    import torch

    from tbmem import MemoryWriter
    from tbmem.snapshot import SnapshotConfig, load_snapshot

    torch.zeros(1, device="cuda")
    with MemoryWriter(tmp_path, every=1, snapshot=SnapshotConfig(steps=(2,))) as writer:
        for step in range(3):
            x = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
            writer.log_memory(step)
    snap = load_snapshot(tmp_path / "plugins/tbmem/snapshot_rank0_step000000002.json.gz")
    assert snap.source == "cuda" and snap.n_events > 0
    assert (tmp_path / "plugins/tbmem/snapshot_rank0_step000000002.pickle").exists()
