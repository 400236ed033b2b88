import numpy as np
import psutil
import pytest

import tbmem._internal.probes.host as host
from tbmem._internal.probes.host import HostProbe, read_peak_rss, reset_peak_rss


def test_rss_matches_psutil():
    probe = HostProbe()
    probe.start()
    reading = probe.read()
    expected = psutil.Process().memory_info().rss
    assert reading["ram_rss"] == pytest.approx(expected, rel=0.1)
    vm = psutil.virtual_memory()
    assert reading["ram_system_available"] == pytest.approx(vm.available, rel=0.2)
    assert 0 <= reading["ram_system_percent"] <= 100
    assert "ram_uss" not in reading


def test_uss_only_when_asked():
    reading = HostProbe(uss=True).read()
    assert 0 < reading["ram_uss"] <= reading["ram_rss"]


def test_windowed_peak_sees_a_freed_allocation_once():
    if not reset_peak_rss():
        pytest.skip("this kernel does not allow resetting VmHWM (/proc/self/clear_refs)")
    probe = HostProbe(peak_mode="window")
    probe.start()
    before = probe.read()["ram_rss"]
    block = np.ones(300 * 2**20 // 8)  # 300 MiB, touched
    del block
    window = probe.read()
    assert window["ram_peak_rss"] >= before + 0.9 * 300 * 2**20
    after = probe.read()
    assert after["ram_peak_rss"] < before + 0.5 * 300 * 2**20


def test_a_window_whose_peak_is_the_rss_is_not_reset_and_still_sees_the_next_peak(monkeypatch):
    if not reset_peak_rss():
        pytest.skip("this kernel does not allow resetting VmHWM (/proc/self/clear_refs)")
    resets: list[bool] = []
    real = host.reset_peak_rss
    monkeypatch.setattr(host, "reset_peak_rss", lambda: resets.append(real()) or resets[-1])
    probe = HostProbe(peak_mode="window")
    probe.start()
    kept = np.ones(200 * 2**20 // 8)  # grows and is kept: the window's peak is the RSS
    grown = probe.read()
    resets.clear()
    probe.read()
    assert resets == []  # a reset would have set the peak to what it is
    block = np.ones(300 * 2**20 // 8)
    del block
    window = probe.read()  # the window's peak is above the RSS: reset, so the next window starts afresh
    assert window["ram_peak_rss"] >= grown["ram_rss"] + 0.9 * 300 * 2**20 and resets == [True]
    assert probe.read()["ram_peak_rss"] < grown["ram_rss"] + 0.5 * 300 * 2**20
    del kept


def test_run_peak_keeps_the_maximum():
    probe = HostProbe(peak_mode="run")
    probe.start()
    block = np.ones(200 * 2**20 // 8)
    del block
    first = probe.read()["ram_peak_rss"]
    second = probe.read()["ram_peak_rss"]
    assert second >= first
    assert first == pytest.approx(read_peak_rss(), rel=0.05)


def test_bad_peak_mode():
    with pytest.raises(ValueError, match="peak_mode"):
        HostProbe(peak_mode="forever")


def test_proc_readings_agree_with_psutil():
    reading = HostProbe().read()
    vm = psutil.virtual_memory()
    assert reading["ram_system_percent"] == pytest.approx(vm.percent, abs=2.0)
    assert reading["ram_system_used"] == pytest.approx(vm.total - vm.available, rel=0.1)
    assert reading["ram_swap_used"] == pytest.approx(psutil.swap_memory().used, abs=64 * 2**20)


def test_psutil_fallback_without_proc(monkeypatch):
    from tbmem._internal.probes import host

    monkeypatch.setattr(host, "_STATUS", "/nonexistent/status")
    monkeypatch.setattr(host, "_MEMINFO", "/nonexistent/meminfo")
    reading = HostProbe(peak_mode="run").read()
    assert reading["ram_rss"] == pytest.approx(psutil.Process().memory_info().rss, rel=0.1)
    assert reading["ram_system_available"] == pytest.approx(psutil.virtual_memory().available, rel=0.2)
    assert reading["ram_peak_rss"] >= reading["ram_rss"]


def test_psutil_access_denied_at_construction_leaves_the_proc_readings(monkeypatch):
    from tbmem._internal.probes import host

    def denied(*args, **kwargs):
        raise psutil.AccessDenied(12345)  # as psutil.Process() does in some containers

    monkeypatch.setattr(host.psutil, "Process", denied)
    probe = HostProbe()  # the old probe called psutil.Process() here and raised
    probe.start()
    np.ones(50 * 2**20 // 8)  # some CPU time for the CPU reading
    reading = probe.read()
    monkeypatch.undo()
    assert reading["ram_rss"] == pytest.approx(psutil.Process().memory_info().rss, rel=0.1)
    assert reading["ram_peak_rss"] >= reading["ram_rss"]
    assert reading["cpu_percent"] >= 0 and "ram_system_available" in reading


def test_cpu_percent_is_this_process_cpu_time_over_wall_time():
    import time

    probe = HostProbe()
    probe.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:  # busy: as much of one core as the machine gives us
        pass
    reading = probe.read()["cpu_percent"]
    expected = (time.process_time() - cpu0) / (time.monotonic() - wall0) * 100
    assert reading == pytest.approx(expected, abs=10)  # os.times ticks are 10 ms
    assert reading > 0


def test_system_memory_is_read_at_most_once_per_system_every_s(monkeypatch):
    import tbmem._internal.probes.host as host

    clock = [100.0]
    monkeypatch.setattr(host.time, "monotonic", lambda: clock[0])
    probe = HostProbe(system_every_s=1.0)
    system = {"ram_system_used", "ram_system_available", "ram_system_percent", "ram_swap_used"}
    seen = []
    for advance in (0.0, 0.4, 0.5, 0.2, 1.0):  # reads at 100.0, 100.4, 100.9, 101.1, 102.1
        clock[0] += advance
        reading = probe.read()
        assert "ram_rss" in reading and "cpu_percent" in reading  # the process's readings every time
        seen.append(system <= set(reading))
        assert not system & set(reading) or system <= set(reading)  # all four or none
    assert seen == [True, False, False, True, True]
    assert all(system <= set(HostProbe().read()) for _ in range(3))  # the default: every read


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan"), "1", True])
def test_a_bad_system_interval_is_refused(value):
    with pytest.raises(ValueError, match="system_every_s"):
        HostProbe(system_every_s=value)
