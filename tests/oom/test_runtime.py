"""An out-of-memory error inside ``monitored_step`` on a fake CUDA device: explained once, re-raised unchanged."""

from __future__ import annotations

import logging

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.oom.runtime import explain_now
from tbmem._internal.tags import TAGS
from tests._events import texts
from tests.fake_cuda import FakeCuda, install_fake_cuda

MiB = 2**20
BASE = 1 << 34
MESSAGE = ("CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which "
           "1.00 MiB is free.")


def _segments():
    """One 20 MiB large-pool segment: 6 MiB live, 4 MiB free, 2 MiB live, 8 MiB free (the largest hole)."""
    blocks = [(6, "active_allocated", "forward"), (4, "inactive", None), (2, "active_allocated", "loss"),
              (8, "inactive", None)]
    out, addr = [], BASE
    for size, state, name in blocks:
        frames = [{"filename": "/home/u/train.py", "line": 7, "name": name}] if name else []
        out.append({"address": addr, "size": size * MiB, "requested_size": size * MiB if name else 0,
                    "state": state, "frames": frames})
        addr += size * MiB
    return [{"device": 0, "address": BASE, "total_size": 20 * MiB, "allocated_size": 8 * MiB,
             "active_size": 8 * MiB, "requested_size": 8 * MiB, "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": out}]


@pytest.fixture
def fake_device(monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(free=1 * MiB, total=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: _segments())
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    return fake


def test_oom_in_monitored_step_prints_the_block_once_and_reraises_the_same_exception(tmp_path, fake_device, caplog):
    writer = MemoryWriter(tmp_path, every=100, census_every=0)
    error = torch.OutOfMemoryError(MESSAGE)
    with caplog.at_level(logging.ERROR, logger="tbmem"), pytest.raises(torch.OutOfMemoryError) as caught, \
            writer.monitored_step(3):
        raise error
    assert caught.value is error and error.__context__ is None
    blocks = [r.getMessage() for r in caplog.records if "ran out of memory" in r.getMessage()]
    assert len(blocks) == 1
    block = blocks[0]
    assert block.startswith("tbmem: out of memory at step 3")  # the one OOM line, then the explanation
    assert "why cuda:0 ran out of memory: no contiguous block of 10.0 MiB existed (largest free block 8.0 MiB)" in block
    assert "expandable_segments:True: 12.0 MiB were reserved but free" in block
    assert "live 6.0 MiB in 1 block(s): forward (/home/u/train.py:7)" in block
    writer.close()
    [(step, text)] = texts(tmp_path, TAGS["oom_text"].tag)
    assert step == 3 and "largest free block 8.0 MiB of 12.0 MiB free: large default pool" in text


def test_explanation_from_the_live_allocator(fake_device):
    x = explain_now(torch.OutOfMemoryError(MESSAGE), step=3, rank=2)
    assert (x.requested_bytes, x.device_free_bytes, x.device_total_bytes) == (10 * MiB, MiB, 80 * 2**30)
    assert (x.reserved_bytes, x.allocated_bytes, x.inactive_split_bytes, x.largest_free_block_bytes) == (
        20 * MiB, 8 * MiB, 12 * MiB, 8 * MiB)
    assert x.outside_allocator_bytes == 80 * 2**30 - MiB - 20 * MiB
    assert x.retries == 2 and x.rank == 2 and x.verdict == "fragmented"
    assert [a["kind"] for a in x.advice] == ["expandable_segments", "max_split_size_mb",
                                            "garbage_collection_threshold", "outside_allocator"]
    assert x.advice[0]["bytes"] == 12 * MiB and x.settings["source"] == "environment"


@pytest.mark.parametrize("conf", ["expandable_segments:True", "max_split_size_mb:64,expandable_segments:True"])
def test_no_advice_for_a_setting_already_on(fake_device, monkeypatch, conf):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    kinds = {a["kind"] for a in x.advice}
    assert x.settings["expandable_segments"] is True and x.verdict == "fragmented"
    assert "expandable_segments" not in kinds and "max_split_size_mb" not in kinds


def test_a_request_that_fits_once_pending_frees_complete_gets_the_retry_note(fake_device, monkeypatch):
    segs = _segments()
    for b in segs[0]["blocks"]:
        if b["state"] == "inactive":  # freed on one stream, still used by another
            b.update(state="active_pending_free", requested_size=b["size"])
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: segs)
    x = explain_now(torch.OutOfMemoryError(MESSAGE))
    assert (x.verdict, x.pending_free_bytes, x.inactive_split_bytes) == ("pending_free", 12 * MiB, 0)
    [retry] = [a for a in x.advice if a["kind"] == "retry_after_free"]
    assert retry["bytes"] == 12 * MiB and "after torch.cuda.synchronize() the same allocation would fit" in retry["text"]
    assert "expandable_segments" not in {a["kind"] for a in x.advice}
