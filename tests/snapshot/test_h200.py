"""Snapshots captured on a real NVIDIA H200 (torch 2.11, CUDA 13.0) by scripts/gpu_check.sh on 2026-11-26,
read on every machine: what torch's allocator reported at their capture (docs/gpu-validation.md) is here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tbmem._internal.snapshot import load_snapshot
from tbmem._internal.snapshot.stats import stats_doc

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
MiB = 2**20


def _doc(name):
    snap = load_snapshot(DATA / name)
    return snap, stats_doc(snap, top=20)["devices"][0]


def test_trainer_window_reserved_bytes_and_step_markers():
    snap, doc = _doc("trainer_window.pickle")
    # torch.cuda.memory_stats() right after the window's last log_memory: reserved 4,194,304
    assert doc["device"] == "cuda:0" and doc["reserved_bytes"] == 4_194_304
    # ... and allocated 76,288: the blocks as the allocator rounded them (the tensors asked for 55,828)
    assert (doc["allocated_bytes"], doc["requested_bytes"]) == (76_288, 55_828)
    assert doc["trace_events"] == 3036
    marks = {(m["label"], m["kind"]) for m in snap.main.markers}
    assert {("step 20", "step"), ("step 21", "step"), ("forward", "phase"), ("backward", "phase"),
            ("optimizer", "phase")} <= marks
    rows = [r for r in doc["top_allocations"] if r["category"] == "python code"]
    assert rows and rows[0]["frame"]["filename"].endswith("trainers/models.py")


def test_oom_event_of_a_real_allocator_and_log_memory_steps_as_step_markers():
    snap, doc = _doc("oom.pickle")
    # a plain MemoryWriter: log_memory marks "after step N" (read as phases before 2026-11-26)
    assert [m["label"] for m in snap.main.markers if m["kind"] == "step"] == [f"after step {i}" for i in range(5)]
    [oom] = doc["ooms"]
    assert (oom["requested_bytes"], oom["free_bytes"]) == (600_439_521_280, 149_234_515_968)
    # issue 38: a request larger than free plus reserved; expandable segments were off (allocator_settings)
    assert oom["verdict"] == "device_full" and [a["kind"] for a in oom["advice"]] == ["request_size"]
    assert oom["settings"]["expandable_segments"] is False and oom["largest_free_block_bytes"] == 12 * MiB
    assert doc["reserved_bytes"] == 90_177_536


@pytest.mark.parametrize("name", ["forecast_2048_step.pickle"])
def test_a_reduction_buffer_the_dispatch_recorder_cannot_see_is_in_the_peak(name):
    # One AdamW step at batch 2048: the allocator's peak (597,413,376 bytes measured by memory_stats)
    # includes a 64 MiB staging buffer inside each bias-gradient sum (docs/gpu-validation.md)
    snap, doc = _doc(name)
    peak_event, _ = snap.main.peak()
    alive = snap.main.alive_at(peak_event)
    sizes = sorted(int(s) for s in snap.main.allocs["size"][alive])
    # tbmem's peak counts requested bytes, torch's the blocks rounded up to 512 bytes: the same moment
    assert doc["peak_bytes"] + sum(-s % 512 if s else 512 for s in sizes) == 597_413_376
    assert sizes.count(64 * MiB) >= 2  # the gradient of the 4096 x 4096 weight and the reduction buffer
