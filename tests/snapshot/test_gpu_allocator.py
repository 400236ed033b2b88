"""On a GPU: tbmem's split of the reserved bytes of a real snapshot against torch.cuda.memory_stats()."""

from __future__ import annotations

import pytest

from tests.snapshot._gpu_capture import capture_and_compare

pytestmark = pytest.mark.gpu


def test_allocator_view_agrees_with_torchs_counters(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    doc = capture_and_compare(str(tmp_path / "snap.pickle"))
    ours, theirs = doc["ours"], doc["torch_stats"]
    for key in ("reserved", "active_blocks", "inactive_split", "segments"):
        assert ours[key] == theirs[key], (key, ours, theirs)
    assert ours["outside"] == 0 and ours["streams"] >= 2 and len(ours["pools"]) >= 2  # a side stream, a graph pool
