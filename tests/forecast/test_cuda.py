"""The CUDA path of the forecast: against a fake allocator here, against a real GPU under -m gpu."""

from __future__ import annotations

import pytest
import torch

from tbmem.forecast import default_budget, fit
from tbmem._internal.forecast.budget import CUDA_LIBRARY_BYTES, cpu_budget, cuda_budget
from tests.fake_cuda import FakeCuda, install_fake_cuda

GiB = 2**30


def test_cuda_budget_is_free_plus_reserved_minus_margins():
    b = cuda_budget(free=10 * GiB, reserved=2 * GiB)
    assert b.bytes == int(12 * GiB - 1.2 * GiB - CUDA_LIBRARY_BYTES)
    before_init = cuda_budget(free=10 * GiB, reserved=0, initialised=False)
    assert before_init.bytes == int(10 * GiB - 1.0 * GiB - CUDA_LIBRARY_BYTES - 512 * 2**20)
    assert "CUDA context" in before_init.explanation
    assert cpu_budget(available=10 * GiB, resident=GiB).bytes == 10 * GiB


def test_default_budget_reads_the_fake_device(monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(free=70 * GiB, reserved=4 * GiB))
    b = default_budget("cuda:0")
    assert b.bytes == int(74 * GiB * 0.9 - CUDA_LIBRARY_BYTES)
    assert "reserved by this process 4.00 GiB" in b.explanation
    assert fake.peak_resets == 0  # reading the budget resets nothing


def test_allocator_peak_and_overhead_are_fitted(monkeypatch):
    # The fake allocator: 3 GiB allocated before each step; the step's allocator peak adds 1000 B per
    # sample and 5000 B the dispatch recorder cannot see (rounding, workspaces).
    fake = install_fake_cuda(monkeypatch, FakeCuda(allocated=3 * GiB, peak_allocated=3 * GiB))
    calls = []

    def step(x):
        calls.append(x.shape[0])
        fake.peak_allocated = max(fake.peak_allocated, fake.allocated + x.shape[0] * 1000 + 5000)

    f = fit(step, lambda n: torch.ones(n, 2), batch_sizes=(8, 16, 32), device="cuda")
    assert f.device == "cuda:0"
    assert calls == [8, 8, 8, 16, 16, 32, 32]  # warm-up, then an unrecorded step before each probe
    assert fake.peak_resets >= 3 and fake.synchronized >= 6
    m = f.measurements[0]
    assert m.allocator_peak_bytes == 3 * GiB + 8 * 1000 + 5000
    assert m.before["unattributed"] == 3 * GiB  # the census finds no tensor on the fake device
    assert m.allocator_overhead_bytes == 8 * 1000 + 5000
    assert f.peak_bytes(4096) == 3 * GiB + 4096 * 1000 + 5000
    assert f.breakdown(4096) == {"unattributed": 3 * GiB, "allocator_overhead": 4096 * 1000 + 5000}
    # budget: the fake device's free + reserved minus the margins
    assert f.max_batch_size() == (int(74 * GiB * 0.9 - CUDA_LIBRARY_BYTES) - 3 * GiB - 5000) // 1000


@pytest.mark.gpu
def test_real_gpu_mlp_forecast_within_5_percent_at_1024():
    assert torch.cuda.is_available()
    torch.manual_seed(0)
    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                                torch.nn.GELU(), torch.nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters())

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev)).backward()
        opt.step()

    f = fit(step, lambda n: (torch.randn(n, 1024), torch.randint(0, 10, (n,))), batch_sizes=(16, 32, 64),
            model=model, optimizer=opt)
    m = f.measure(1024)
    assert m.allocator_peak_bytes is not None and m.peak_bytes == m.allocator_peak_bytes
    assert abs(m.error) < 0.05, f.table(at=[1024])
