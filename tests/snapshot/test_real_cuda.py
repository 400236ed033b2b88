"""Snapshots of a real CUDA device, with and without history (deselected by default; ``pytest -m gpu``)."""

from __future__ import annotations

import pytest
import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal.snapshot import load_snapshot
from tbmem._internal.snapshot.stats import stats_doc

pytestmark = pytest.mark.gpu
MiB = 2**20


def _device_doc(path, index):
    doc = stats_doc(load_snapshot(path))
    return next(d for d in doc["devices"] if d["device"] == f"cuda:{index}")


@pytest.mark.parametrize("history", [False, True], ids=["state-only", "with-history"])
def test_a_real_snapshot_matches_memory_stats(tmp_path, history):
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=dev)
    if history:
        assert tp.record_memory_history(stacks="python", max_entries=10_000)
    try:
        blocks = [torch.empty(n * MiB + 512, dtype=torch.uint8, device=dev) for n in (1, 3, 7, 30)]
        del blocks[1]  # a freed block inside a segment: inactive, still reserved
        raw = tp.cuda_snapshot()
        stats = torch.cuda.memory_stats(dev)
    finally:
        if history:
            tp.stop_memory_history()
    path = tmp_path / "snapshot.pickle"
    tp.dump_snapshot_pickle(raw, str(path))
    d = _device_doc(path, dev.index)
    assert d["reserved_bytes"] == stats["reserved_bytes.all.current"]
    assert d["allocated_bytes"] == stats["allocated_bytes.all.current"]
    assert (d["trace_events"] > 0) == history
    assert d["peak_bytes"] >= d["allocated_bytes"]
    del blocks
