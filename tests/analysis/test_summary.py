"""summarize() on logdirs with known values: peaks, category mix at the census peak, step times."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from tbmem.analysis import NoTbmemTagsError, summarize
from tests.analysis._logdirs import CATEGORY, write_run

STEPS = range(0, 200, 10)
STEP_MS = {s: 20.0 + (s % 70) / 2 for s in STEPS}  # float32-exact


def gpu_values(step: int) -> dict[str, float]:
    values = {
        "Memory/GPU/vram_allocated_GB": 1.0 + (step == 120) * 0.5,
        "Memory/GPU/vram_peak_allocated_GB": 1.25 + (step == 90) * 1.5,  # the window peak beats allocated
        "Memory/GPU/vram_reserved_GB": 3.0,
        "Memory/GPU/vram_peak_reserved_GB": 3.0 + (step == 150),
        "Memory/fragmentation_percent": 10.0 + (step == 40) * 22.5,
        "Memory/RAM/process_rss_GB": 2.0,
        "Perf/step_time_ms": STEP_MS[step],
        "Loss/train": 1.0 / (1 + step),
    }
    if step % 50 == 0:  # a census every 50 steps; the biggest at step 100
        acts = 64.0 if step == 100 else 16.0
        values.update({CATEGORY.format("parameters"): 8.0, CATEGORY.format("activations"): acts,
                       CATEGORY.format("unattributed"): 2.0, "Memory/Tensor_Census/total_MB": 8.0 + acts})
    return values


@pytest.fixture
def logdir(tmp_path):
    write_run(tmp_path / "gpu", STEPS, gpu_values)
    write_run(tmp_path / "cpu", STEPS, lambda s: {"Memory/RAM/process_rss_GB": 0.5 + (s == 70) * 0.25})
    write_run(tmp_path / "plain", STEPS, lambda s: {"Loss/train": 1.0})  # not a tbmem run
    return tmp_path


def test_gpu_run_summary(logdir):
    cpu, gpu = summarize(logdir)
    assert (cpu.run, gpu.run) == ("cpu", "gpu")
    assert (gpu.first_step, gpu.last_step, gpu.records) == (0, 190, 20)
    assert (gpu.peak_allocated_gb, gpu.peak_allocated_step) == (2.75, 90)
    assert gpu.peak_reserved_gb == 4.0 and gpu.peak_rss_gb == 2.0
    assert gpu.max_fragmentation_percent == 32.5
    assert (gpu.census_peak_step, gpu.census_peak_total_mb) == (100, 72.0)
    assert gpu.category_mb_at_peak == {"parameters": 8.0, "activations": 64.0, "unattributed": 2.0}
    times = [STEP_MS[s] for s in STEPS]
    expected = {"mean": statistics.fmean(times), "median": statistics.median(times),
                "p95": float(np.quantile(times, 0.95)), "max": max(times)}
    assert gpu.step_time_ms == pytest.approx(expected)
    assert gpu.last_loss == {"Loss/train": pytest.approx(1.0 / 191)}
    assert gpu.leaks == [] and not gpu.has_leak


def test_cpu_run_has_no_device_numbers(logdir):
    cpu = summarize(logdir, runs=["cpu"])[0]
    assert (cpu.peak_rss_gb, cpu.peak_rss_step) == (0.75, 70)
    assert cpu.peak_allocated_gb is None and cpu.peak_reserved_gb is None
    assert cpu.max_fragmentation_percent is None and cpu.census_peak_step is None
    assert cpu.category_mb_at_peak == {} and cpu.step_time_ms is None
    d = cpu.to_dict()
    assert d["peak_allocated_gb"] is None and d["leaks"] == []


def test_census_peak_without_a_total_tag_uses_the_categories(tmp_path):
    write_run(tmp_path, range(0, 40, 10),
              lambda s: {CATEGORY.format("parameters"): 4.0, CATEGORY.format("other"): float(s == 20) * 3,
                         CATEGORY.format("unattributed"): float(s == 30) * 100})  # not a census total
    (s,) = summarize(tmp_path)
    assert (s.census_peak_step, s.census_peak_total_mb) == (20, 7.0)
    assert s.category_mb_at_peak == {"parameters": 4.0, "other": 3.0, "unattributed": 0.0}


def test_leaks_appear_in_the_summary(tmp_path):
    write_run(tmp_path, range(0, 400, 20), lambda s: {CATEGORY.format("activations"): s / 4})
    (s,) = summarize(tmp_path)
    assert s.has_leak and [f.category for f in s.leaks] == ["activations"]
    assert s.leaks[0].slope_mb_per_1k == pytest.approx(250.0)
    assert summarize(tmp_path, threshold_mb_per_1k=300.0)[0].leaks == []


def test_no_tbmem_tags_is_a_clear_error(logdir):
    with pytest.raises(NoTbmemTagsError, match=r"no tbmem memory tags .* tags found: Loss/train"):
        summarize(logdir / "plain")
    with pytest.raises(NoTbmemTagsError, match="run 'plain' has no tbmem memory tags"):
        summarize(logdir, runs=["gpu", "plain"])


def test_census_cost_is_its_share_of_the_run(tmp_path):
    from tbmem.analysis import summarize
    from tbmem._internal.analysis.table import format_table
    from tbmem._internal.tags import TAGS
    from tests.analysis._logdirs import write_run

    # records every 10 steps of 10 ms each (100 ms between records); a 5 ms census at steps 0, 20, 40
    write_run(tmp_path, range(0, 50, 10), lambda s: {
        "Memory/RAM/process_rss_GB": 0.5, TAGS["step_time"].tag: 10.0,
        **({TAGS["census_duration"].tag: 5.0} if s % 20 == 0 else {})})
    (s,) = summarize(tmp_path)
    # the step-0 census precedes the first timed interval; 2 x 5 ms inside 400 ms
    assert s.census_cost == {"censuses": 3.0, "median_ms": 5.0, "percent": pytest.approx(2.5)}
    row = next(r for r in format_table([s]).splitlines() if r.startswith("census cost"))
    assert row.split(None, 2)[2].strip() == "5 ms median, 2.5%"
