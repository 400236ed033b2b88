import pytest
import torch

from tbmem._internal._extras import MissingExtraError
from tbmem._internal.probes.device import CudaProbe, NvmlProbe, fragmentation_percent
from tests.fake_cuda import install_fake_cuda


def test_no_cuda_means_no_readings_and_no_initialisation():
    assert CudaProbe().read() == {}
    assert not torch.cuda.is_initialized()


def test_readings_from_the_allocator(monkeypatch):
    fake = install_fake_cuda(monkeypatch)
    probe = CudaProbe(peak_mode="window")
    probe.start()
    r = probe.read()
    assert r["vram_allocated"] == fake.allocated
    assert r["vram_reserved"] == fake.reserved
    assert r["vram_active"] == fake.active
    assert r["vram_inactive_split"] == fake.inactive_split
    assert r["vram_total"] == fake.total and r["vram_free"] == fake.free
    assert r["fragmentation"] == pytest.approx((4 - 3) / 4 * 100)
    assert r["vram_percent"] == pytest.approx(4 / 80 * 100)
    assert r["vram_alloc_retries"] == 2 and r["vram_ooms"] == 1


def test_window_peaks_reset_run_peaks_do_not(monkeypatch):
    fake = install_fake_cuda(monkeypatch)
    fake.peak_allocated = 7 * 2**30
    window = CudaProbe(peak_mode="window")
    assert window.read()["vram_peak_allocated"] == 7 * 2**30
    assert window.read()["vram_peak_allocated"] == fake.allocated  # reset after the first read
    fake.peak_allocated = 9 * 2**30
    resets = fake.peak_resets
    run = CudaProbe(peak_mode="run")
    assert run.read()["vram_peak_allocated"] == 9 * 2**30
    assert run.read()["vram_peak_allocated"] == 9 * 2**30
    assert fake.peak_resets == resets


def test_fragmentation_formula():
    assert fragmentation_percent(30, 40) == pytest.approx(25.0)
    assert fragmentation_percent(0, 0) == 0.0


def test_nvml_missing_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(MissingExtraError, match=r"tbmem\[nvml\]"):
        NvmlProbe()


@pytest.mark.gpu
def test_real_cuda_readings():
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    r = CudaProbe().read()
    assert r["vram_allocated"] >= x.numel()
    assert r["vram_reserved"] >= r["vram_allocated"]
