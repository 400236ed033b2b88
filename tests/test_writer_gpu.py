"""MemoryWriter on a real CUDA device (deselected by default; ``pytest -m gpu``; see scripts/gpu_check.sh)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.snapshot import SnapshotConfig
from tests._events import read_events

pytestmark = pytest.mark.gpu
GiB = 2**30


def test_vram_tags_equal_the_allocator_at_each_record(tmp_path):
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=dev)
    expected = {}
    keep = []
    with MemoryWriter(tmp_path, every=1, census_every=2, device=dev.index) as writer:
        for step in range(4):
            keep.append(torch.empty((step + 1) * 64 * 2**20, dtype=torch.uint8, device=dev))
            writer.log_memory(step)
            stats = torch.cuda.memory_stats(dev)
            expected[step] = (stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"])
    acc = read_events(tmp_path)

    def values(tag):
        return {e.step: e.value for e in acc.Scalars(tag)}

    allocated, reserved = values("Memory/GPU/vram_allocated_GB"), values("Memory/GPU/vram_reserved_GB")
    fragmentation = values("Memory/fragmentation_percent")
    for step, (a, r) in expected.items():
        assert allocated[step] == pytest.approx(a / GiB, rel=1e-6)  # float32 scalars
        assert reserved[step] == pytest.approx(r / GiB, rel=1e-6)
        assert fragmentation[step] == pytest.approx((r - a) / r * 100, rel=1e-5, abs=1e-5)
    assert sorted(values("Memory/Tensor_Category/unattributed_MB")) == [0, 2]


def test_a_real_out_of_memory_error_is_saved_and_reraised_unchanged(tmp_path):
    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Linear(1024, 1024).to(dev)
    raised, caught = [], None
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=SnapshotConfig(every=1000)) as writer:
        writer.watch(model)
        for step in range(3):
            try:
                with writer.monitored_step(step):
                    model(torch.randn(8, 1024, device=dev)).sum().backward()
                    if step == 2:
                        try:
                            torch.empty(4 * torch.cuda.get_device_properties(dev).total_memory,
                                        dtype=torch.uint8, device=dev)
                        except torch.OutOfMemoryError as exc:
                            raised.append(exc)
                            raise
            except torch.OutOfMemoryError as exc:
                caught = exc
    assert raised and caught is raised[0] and caught.__context__ is None
    path = tmp_path / "plugins" / "tbmem" / "oom_rank0_step000000002.json.gz"
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    assert "OutOfMemoryError" in doc["meta"]["exception"]
    ooms = read_events(tmp_path).Scalars("Memory/GPU/vram_ooms")
    assert ooms[-1].step == 2 and ooms[-1].value >= 1
