"""The Memory tab's OOM mark carries the explanation the run wrote (a real tensorboard on 127.0.0.1)."""

from __future__ import annotations

import torch

from tbmem import MemoryWriter
from tests.oom.test_runtime import MESSAGE, fake_device  # noqa: F401 - the fixture
from tests.plugin._logdir import Server, get_json


def test_oom_mark_says_why(tmp_path, fake_device):  # noqa: F811
    fake_device.ooms = 0
    with MemoryWriter(tmp_path / "logs" / "gpu", every=1, census_every=0, custom_layout=False) as w:
        for step in range(4):
            try:
                with w.monitored_step(step):
                    if step == 3:
                        fake_device.ooms = 1  # the allocator counts the OOM it raises
                        raise torch.OutOfMemoryError(MESSAGE)
            except torch.OutOfMemoryError:
                pass
    srv = Server(tmp_path, "--logdir", str(tmp_path / "logs"), "--load_fast", "false", wait_run="gpu")
    try:
        doc = get_json(f"{srv.base}/data/plugin/tbmem/overview?run=gpu")
    finally:
        srv.stop()
    [mark] = [m for m in doc["marks"] if m["kind"] == "oom"]
    assert mark["step"] == 3
    assert mark["label"].endswith(": no contiguous block of 10.0 MiB existed (largest free block 8.0 MiB)")
    assert mark["why"].startswith("tbmem: why cuda:0 ran out of memory") and "advice: PYTORCH_CUDA_ALLOC_CONF" in mark["why"]
