"""Alerts: each fires once, at the record that crosses its line, with one warning and a text entry read
back from the event file; snapshots on an alert; failures switch alerts off, never training."""

from __future__ import annotations

import logging
import os

import psutil
import pytest
import torch

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem._internal.alerts import ALERTS_TEXT_TAG, AlertConfig, AlertMonitor
from tests._events import texts
from tests.fake_cuda import FakeCuda, install_fake_cuda

GiB = 2**30
QUIET = {"device_percent": None, "host_percent": None, "growth_mb_per_1k": None, "rss_growth_mb_per_1k": None,
         "alloc_retries": False}


def _alerts(**on):
    return {**QUIET, **on}


def _alert_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "tbmem" and "tbmem alert" in r.getMessage()]


def test_device_percent_fires_once_at_the_crossing_step(tmp_path, monkeypatch, tbmem_log):
    fake = install_fake_cuda(monkeypatch, FakeCuda(total=80 * GiB, free=70 * GiB))
    with MemoryWriter(tmp_path, every=10, census_every=0, alerts=_alerts(device_percent=90)) as w:
        for step in range(70):
            fake.free = 4 * GiB if step >= 30 else 70 * GiB  # 95% in use from step 30 on
            w.log_memory(step)
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert entry[0] == 30
    assert "device memory 95.0% in use (threshold 90%): 76.00 of 80.00 GiB" in entry[1]
    (line,) = _alert_lines(tbmem_log)
    assert line.startswith("tbmem alert at step 30: device memory 95.0% in use")
    assert tbmem_log.records[-1].levelno == logging.WARNING


def test_host_percent_fires_at_the_first_record_over_the_line(tmp_path, tbmem_log):
    threshold = max(1.0, psutil.virtual_memory().percent - 20.0)  # the real reading is above it
    with MemoryWriter(tmp_path, every=5, census_every=0, alerts=_alerts(host_percent=threshold)) as w:
        for step in range(20):
            w.log_memory(step)
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert entry[0] == 0 and "system RAM" in entry[1] and "this process's RSS" in entry[1]
    assert len(_alert_lines(tbmem_log)) == 1


def test_host_percent_under_the_line_stays_silent(tmp_path, tbmem_log):
    with MemoryWriter(tmp_path, every=1, census_every=0, alerts=_alerts(host_percent=100)) as w:
        for step in range(10):
            w.log_memory(step)
    assert texts_or_empty(tmp_path) == [] and _alert_lines(tbmem_log) == []


def texts_or_empty(logdir):
    try:
        return texts(logdir, ALERTS_TEXT_TAG)
    except KeyError:
        return []


def test_growth_of_allocated_memory_fires_when_the_window_shows_it(tmp_path, monkeypatch, tbmem_log):
    fake = install_fake_cuda(monkeypatch, FakeCuda(allocated=GiB))
    with MemoryWriter(tmp_path, every=2, census_every=0,
                      alerts=_alerts(growth_mb_per_1k=5.0, growth_window=10)) as w:
        for step in range(60):
            fake.allocated = GiB + step * 2**20  # +1 MiB per step: 1000 MB per 1000 steps from the start
            w.log_memory(step)
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert entry[0] == 18  # the 10th record (steps 0, 2, ..., 18) fills the window
    assert "allocated device memory grows +1000.0 MB per 1000 steps over the last 10 records" in entry[1]
    assert "steps 0..18" in entry[1]
    assert len(_alert_lines(tbmem_log)) == 1


def test_one_jump_is_not_growth(tmp_path, monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(allocated=GiB))
    with MemoryWriter(tmp_path, every=1, census_every=0, alerts=_alerts(growth_mb_per_1k=5.0, growth_window=10)) as w:
        for step in range(40):
            fake.allocated = GiB + (step >= 15) * 512 * 2**20  # a buffer allocated once
            w.log_memory(step)
        assert w._alerts.fired == []


def test_real_rss_leak_on_cpu_fires(tmp_path, tbmem_log):
    kept = []
    with MemoryWriter(tmp_path, every=1, census_every=0,
                      alerts=_alerts(rss_growth_mb_per_1k=100.0, growth_window=6)) as w:
        for step in range(10):
            # 40 MiB per step, kept: above glibc's largest mmap threshold (32 MiB), so each is fresh pages
            # and RSS grows at once, whatever holes earlier tests left in the heap
            kept.append(torch.ones(10 * 2**20))
            w.log_memory(step)
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert entry[0] == 5 and "process RSS grows" in entry[1]  # the 6th record fills the window
    assert len(_alert_lines(tbmem_log)) == 1


def test_alloc_retries_fire_when_they_rise(tmp_path, monkeypatch, tbmem_log):
    fake = install_fake_cuda(monkeypatch, FakeCuda(retries=0))
    with MemoryWriter(tmp_path, every=10, census_every=0, alerts=_alerts(alloc_retries=True)) as w:
        for step in range(60):
            fake.retries = 0 if step < 20 else (3 if step < 40 else 5)
            w.log_memory(step)
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert entry[0] == 20 and "retries rose from 0 (step 10) to 3" in entry[1]
    assert len(_alert_lines(tbmem_log)) == 1


def test_repeat_rearms_after_the_condition_clears(tmp_path, monkeypatch):
    fake = install_fake_cuda(monkeypatch, FakeCuda(retries=0))
    with MemoryWriter(tmp_path, every=10, census_every=0, alerts=_alerts(alloc_retries=True, repeat=True)) as w:
        for step in range(60):
            fake.retries = 0 if step < 20 else (3 if step < 40 else 5)
            w.log_memory(step)
    assert [s for s, _ in texts(tmp_path, ALERTS_TEXT_TAG)] == [20, 40]


def test_hysteresis_keeps_one_episode_one_alert():
    monitor = AlertMonitor(AlertConfig(**_alerts(host_percent=90.0), repeat=True, hysteresis=5.0))
    fired = [s for s, v in enumerate([80, 91, 88, 92, 86, 84, 91]) for _ in monitor.check(s, {"ram_system_percent": v})]
    assert fired == [1, 6]  # 88 and 86 stay within 5 points of the line; 84 clears it


def test_snapshot_on_alert_without_a_snapshot_schedule(tmp_path):
    model = torch.nn.Linear(64, 64)
    with MemoryWriter(tmp_path, every=5, census_every=0, alerts=_alerts(host_percent=1.0, snapshot=True)) as w:
        w.watch(model)
        for step in range(10):
            model(torch.ones(2, 64)).sum().backward()
            w.log_memory(step)
    folder = tmp_path / "plugins" / "tbmem"
    assert sorted(os.listdir(folder)) == ["alert_rank0_step000000000.html", "alert_rank0_step000000000.json.gz"]
    from tbmem._internal.snapshot.schema import read_json_gz

    snap = read_json_gz(str(folder / "alert_rank0_step000000000.json.gz"))
    assert snap.kind == "alert" and snap.step == 0
    assert int(snap.allocs["size"].sum()) >= 64 * 64 * 4  # the watched parameters, at least
    (entry,) = texts(tmp_path, ALERTS_TEXT_TAG)
    assert "Snapshot written" in entry[1] and "alert_rank0_step000000000.json.gz" in entry[1]


def test_snapshot_on_alert_with_a_recording_running(tmp_path):
    with MemoryWriter(tmp_path, every=4, census_every=0, alerts=_alerts(host_percent=1.0, snapshot=True),
                      snapshot={"every": 1000, "html": False}) as w:
        for step in range(6):
            kept = torch.ones(1024) * step
            w.log_memory(step)
    from tbmem._internal.snapshot.schema import read_json_gz

    snap = read_json_gz(str(tmp_path / "plugins" / "tbmem" / "alert_rank0_step000000000.json.gz"))
    assert snap.kind == "alert" and snap.n_events > 0  # the recording so far, not only the watched tensors
    del kept


def test_a_failing_alert_check_is_reported_once_and_switched_off(tmp_path, monkeypatch, tbmem_log):
    def broken(self, step, readings):
        raise RuntimeError("boom")

    monkeypatch.setattr(AlertMonitor, "check", broken)
    with MemoryWriter(tmp_path, every=1, census_every=0, alerts=True) as w:
        for step in range(5):
            assert w.log_memory(step)
        assert "alerts" not in [c.name for c in w._components.all]
    failures = [r for r in tbmem_log.records if "alerts failed" in r.getMessage()]
    assert len(failures) == 1 and "boom" in failures[0].getMessage()


def test_disabled_writer_checks_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(AlertMonitor, "check", lambda self, s, r: calls.append(s) or [])
    with MemoryWriter(tmp_path, enabled=False, alerts=True) as w:
        w.log_memory(0)
    assert calls == []


def test_config_accepts_true_mappings_and_names_bad_values():
    assert MemoryWriterConfig(alerts=True).alerts == AlertConfig()
    assert MemoryWriterConfig(alerts=False).alerts is None
    cfg = MemoryWriterConfig.from_mapping({"alerts": {"device_percent": 95, "snapshot": True}})
    assert cfg.alerts.device_percent == 95 and cfg.alerts.snapshot
    message = r"unknown AlertConfig key 'device_pct' \(did you mean 'device_percent'\?\); valid keys: "
    with pytest.raises(ValueError, match=message):
        MemoryWriterConfig(alerts={"device_pct": 95})
    with pytest.raises(ValueError, match="growth_window must be an integer >= 4"):
        AlertConfig(growth_window=2)
    with pytest.raises(ValueError, match="rss_growth_mb_per_1k must be None or > 0"):
        AlertConfig(rss_growth_mb_per_1k=0)
    with pytest.raises(ValueError, match="alerts must be"):
        MemoryWriterConfig(alerts="yes")
