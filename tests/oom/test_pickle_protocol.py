"""Snapshots tbmem writes in PyTorch's pickle format use protocol 4 or lower, whatever Python's default.

Python 3.14 pickles with protocol 5 by default; PyTorch's memory_viz then shows nothing (torchtitan #3375).
"""

from __future__ import annotations

import pickle
import pickletools

import torch

from tbmem import MemoryWriter
from tbmem._internal.snapshot.config import SnapshotConfig
from tests.oom.test_runtime import MESSAGE, _segments, fake_device  # noqa: F401 - the fixture

PROTOCOL_5_OPS = {"BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"}


def _protocol(path) -> tuple[int, set[str]]:
    ops = list(pickletools.genops(path.read_bytes()))
    first = ops[0]
    assert first[0].name == "PROTO"
    return int(first[1]), {op.name for op, _, _ in ops}


def test_oom_snapshot_pickle_is_protocol_4_under_a_protocol_5_default(tmp_path, fake_device, monkeypatch):  # noqa: F811
    monkeypatch.setattr(pickle, "DEFAULT_PROTOCOL", 5)
    raw = {"segments": _segments(), "device_traces": [[{"action": "alloc", "addr": 1 << 34, "size": 6 << 20,
                                                       "stream": 0, "time_us": 1_800_000_000_000_000,
                                                       "frames": [], "payload": bytearray(b"x" * 16)}]]}
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: raw)
    run = tmp_path / "run"
    writer = MemoryWriter(run, every=100, census_every=0, snapshot=SnapshotConfig(pickle=True, html=False))
    try:
        with writer.monitored_step(2):
            raise torch.OutOfMemoryError(MESSAGE)
    except torch.OutOfMemoryError:
        pass
    writer.close()
    pickles = sorted(run.rglob("*.pickle"))
    assert pickles, sorted(p.name for p in run.rglob("*"))
    for path in pickles:
        proto, ops = _protocol(path)
        assert proto <= 4 and not ops & PROTOCOL_5_OPS
        assert pickle.loads(path.read_bytes())["segments"][0]["total_size"] == 20 << 20
