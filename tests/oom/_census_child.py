"""A training step that runs out of memory on a fake CUDA device, in a process of its own (so that no other
test's tensors are in its census): prints the test's own count of parameters, gradients and optimizer state.

    python -m tests.oom._census_child LOGDIR
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.snapshot.config import SnapshotConfig
from tests.fake_cuda import FakeCuda, install_fake_cuda
from tests.oom.test_runtime import MESSAGE, _segments

MiB = 2**20


def _nbytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def main(logdir: str) -> None:
    mp = pytest.MonkeyPatch()
    install_fake_cuda(mp, FakeCuda(free=MiB, total=80 * 2**30))
    raw = {"segments": _segments(), "device_traces": [[
        {"action": "alloc", "addr": 1 << 34, "size": 6 * MiB, "stream": 0, "time_us": 1_800_000_000_000_000,
         "frames": []},
        {"action": "oom", "device_free": MiB, "size": 10 * MiB, "stream": 0, "time_us": 1_800_000_000_000_100,
         "frames": []}]]}
    mp.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: _segments())
    mp.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    mp.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: raw)
    mp.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    writer = MemoryWriter(logdir, every=100, census_every=1000, snapshot=SnapshotConfig(html=False))
    writer.watch(model, opt)
    try:
        with writer.monitored_step(5):
            raise torch.OutOfMemoryError(MESSAGE)
    except torch.OutOfMemoryError:
        pass
    writer.close()
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    print(json.dumps({"parameters": _nbytes(params), "gradients": _nbytes([p.grad for p in params]),
                      "optimizer_state": _nbytes(state)}))


if __name__ == "__main__":
    main(sys.argv[1])
